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
