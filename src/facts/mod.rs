//! Facts: the typed input of a decision. A pack family's [`Schema`] (the `te` family in
//! [`te`], the `torch` family in [`torch`], registered in [`families`](mod@families)) names each fact with its
//! type, domain and default; [`Facts`] holds one value per fact; [`presets`] are named
//! configurations.

pub mod constraint;
pub mod domains;
pub mod error;
pub mod families;
pub mod input;
pub mod key;
pub mod presets;
pub mod schema;
pub mod te;
pub mod text;
pub mod torch;
pub mod value;

pub use domains::Domain;
pub use error::{InputError, InputErrorKind, did_you_mean};
pub use families::{families, family};
pub use schema::{Bound, Check, Constraint, Facts, FieldDef, Origin, Schema, SelectionFact, Ty};
pub use text::ConfigText;
pub use value::Value;
