//! Facts: the typed input of a decision. A pack family's [`Schema`] (the `te` family in
//! [`te`], the `torch` family in [`torch`]) names each fact with its type, domain and default; [`Facts`] holds one value per
//! fact; [`presets`] are named configurations.

pub mod constraint;
pub mod domains;
pub mod input;
pub mod key;
pub mod presets;
pub mod schema;
pub mod te;
pub mod text;
pub mod torch;
pub mod value;

pub use constraint::{Bound, Check, Constraint};
pub use domains::Domain;
pub use input::{Facts, InputError, InputErrorKind, did_you_mean};
pub use schema::{FieldDef, Origin, Schema, Ty, families, family};
pub use text::ConfigText;
pub use value::Value;
