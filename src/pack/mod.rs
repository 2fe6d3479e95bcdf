//! Rule packs: YAML files with positions, loaded and type-checked into a
//! [`Policy`](crate::Policy) in stages (see [`load_pack`]), the packs embedded in the binary, and
//! [`PackSpec`], the one way every front end says which pack to load.

mod docs;
mod embedded;
mod load;
mod release;
mod shown;
mod source;
mod spec;
mod yaml;

pub use crate::policy::AutoRelease;
pub use docs::definitions_page;
pub use embedded::{
    all_names as embedded_names, file as embedded_file, pack_names as embedded_pack_names,
    release_names as embedded_release_names,
};
pub use load::{LoadError, PackSource, load_pack, load_pack_with};
pub use release::{AUTO, ReleaseError, is_auto, resolve_installed, upstream};
pub use shown::definitions_table;
pub use spec::{PackError, PackSpec};
