//! Rule packs: YAML files with positions, loaded and type-checked into a
//! [`Policy`](crate::Policy) in stages (see [`load`]), the packs embedded in the binary, and
//! [`PackSpec`], the one way every front end says which pack to load.

pub mod docs;
pub mod embedded;
pub mod load;
pub mod release;
pub mod shown;
pub mod source;
pub mod spec;
pub mod yaml;

pub use load::{LoadError, PackSource, load_pack, load_pack_with};
pub use spec::{PackError, PackSpec};
