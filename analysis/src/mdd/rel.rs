//! [`Rel`], what a relation variable stands for (an ordering of two facts, or an atom the
//! classes do not decide); `relations` adds them to the manager and ties them to the facts.

use attn_policy::eval::program::NodeId;

/// A relation variable: a diagram variable that is not a fact but the truth of a condition
/// the facts' classes do not decide. It sits just below the deepest fact it reads.
#[derive(Clone, Debug)]
pub enum Rel {
    /// The ordering of two integer facts (vars `x` < `y`); classes: less, equal, greater.
    Ord { x: usize, y: usize },
    /// An atom (non-linear arithmetic, a comparison of expressions of several facts) on the
    /// cells where it is not provably constant; classes: false, true. `vars`: what it reads.
    Pred {
        prog: usize,
        node: NodeId,
        vars: Vec<usize>,
        text: String,
    },
}
