//! The reusable memos of the cover's pair traversals (`holds_unless`, `allowed_unless`),
//! held by the manager between calls; the traversals that fill them are in `cover`. The
//! memos of `expand` and `widen_inside` are `WidenMemos` (below; used by widen.rs).

use super::store::{HashMap, Id, NodeMemo};

/// The memos of `Mdd::holds_unless`: per node of `f` the first pair's answer, other pairs.
#[derive(Default)]
pub(super) struct PairMemos {
    pub(super) first: NodeMemo<u32>,
    /// (answer, generation, level): checked against `first`'s forgetting.
    pub(super) more: HashMap<(Id, Id), (bool, u32, u32)>,
}

/// Memos of `Mdd::widen_inside`'s walks, with the interned cube suffixes they are keyed by
/// (widen.rs has their methods and says what the suffixes are).
#[derive(Default)]
pub(super) struct WidenMemos {
    /// Class sets (a cube's entry) -> id.
    pub(super) sets: HashMap<Box<[u64]>, u32>,
    /// (level, set id of its var, id of the suffix below) -> suffix id (>= 1).
    pub(super) suffixes: HashMap<(u32, u32, u32), u32>,
    /// Per level (and one past the last): the current cube's suffix id from that level.
    pub(super) at: Vec<u32>,
    /// Per var: the set id of the current cube's entry.
    pub(super) set_of: Vec<u32>,
    /// Per node `f`: (suffix id, `valid << 1 | answer`) of one pair; 0: none.
    pub(super) first: Vec<(u32, u32)>,
    /// Other pairs: (f, valid, suffix id) -> answer.
    pub(super) more: HashMap<(Id, Id, u32), bool>,
    /// Per node: `suffix id << 1 | answer` of `f` alone holding everywhere; 0: none.
    pub(super) single: Vec<u32>,
    /// Per node: (suffix id, level, start in `allowed_sets`) of its allowed classes of the
    /// var at that level (`expand`; the var itself left open in the suffix); id 0: none.
    pub(super) allowed: Vec<(u32, u32, u32)>,
    /// The allowed sets' words (the words of the var at their level each).
    pub(super) allowed_sets: Vec<u64>,
}
