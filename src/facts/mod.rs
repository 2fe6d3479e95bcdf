//! Facts: the typed input of a decision (schema, domains, values, reading configs, presets).

pub mod domains;
pub mod input;
pub mod presets;
pub mod schema;
pub mod value;

pub use domains::Domain;
pub use input::{Facts, InputError, did_you_mean};
pub use schema::{FIELDS, FieldDef, Origin, Ty};
pub use value::Value;
