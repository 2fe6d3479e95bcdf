//! The reusable memos of the cover's pair traversals (`holds_unless`, `allowed_unless`),
//! held by the manager between calls; the traversals that fill them are in `cover`. The
//! memos of `expand` and `widen_inside` are `widen::WidenMemos`.

use super::store::{HashMap, Id, NodeMemo};

/// The memos of `Mdd::holds_unless`: per node of `f` the first pair's answer, other pairs.
#[derive(Default)]
pub(super) struct PairMemos {
    pub(super) first: NodeMemo<u32>,
    /// (answer, generation, level): checked against `first`'s forgetting.
    pub(super) more: HashMap<(Id, Id), (bool, u32, u32)>,
}
