//! The reusable memos of the cover's traversals (`expand`, `holds_unless`), held by the
//! manager between calls; the traversals that fill them are in `cover`.

use super::store::{HashMap, Id, NodeMemo};

/// The memos of `expand`: `allowed` per node (an index into the sets) and `everywhere`.
#[derive(Default)]
pub(super) struct ExpandMemos(
    pub(super) (NodeMemo<u32>, Vec<u64>),
    pub(super) NodeMemo<bool>,
);

/// The memos of `Mdd::holds_unless`: per node of `f` the first pair's answer, other pairs.
#[derive(Default)]
pub(super) struct PairMemos {
    pub(super) first: NodeMemo<u32>,
    /// (answer, generation, level): checked against `first`'s forgetting.
    pub(super) more: HashMap<(Id, Id), (bool, u32, u32)>,
}

/// A memo the manager lends to its read-only traversals ([`Reuse::take`] it, [`Reuse::set`] it
/// back): a `Cell` would do for one thread, but `gaps` widens its regions on two threads at
/// once (`Mdd::widen_all`), so the manager must be `Sync`. A traversal that finds it lent
/// out takes a fresh one (empty: memos are cleared before use anyway).
#[derive(Default)]
pub(super) struct Reuse<T: Default>(std::sync::Mutex<T>);

impl<T: Default> Reuse<T> {
    pub(super) fn new(x: T) -> Self {
        Reuse(std::sync::Mutex::new(x))
    }

    /// The memo (a fresh one when another traversal holds it).
    pub(super) fn take(&self) -> T {
        match self.0.try_lock() {
            Ok(mut m) => std::mem::take(&mut *m),
            Err(_) => T::default(),
        }
    }

    /// Gives the memo back (of two given back at once, one is kept).
    pub(super) fn set(&self, x: T) {
        if let Ok(mut m) = self.0.try_lock() {
            *m = x;
        }
    }
}
