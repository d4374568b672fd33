//! Node configuration: defaults, file, environment overrides, and errors that name the key.

mod errors;
mod helpers;
mod keys;
mod reference;
mod settings;
