//! Rule packs: YAML files with positions, loading and type-checking into a [`Policy`](crate::Policy),
//! and the packs embedded in the binary.

pub mod embedded;
pub mod load;
pub mod source;
pub mod yaml;

pub use load::{LoadError, PackSource, load_pack};
