//! Status reports: the analysed model and its NCCL-compatible text and JSON renderings.

mod json;
pub mod model;
mod text;

#[cfg(test)]
pub(crate) mod tests;

pub use json::render_json;
pub use model::*;
pub use text::render_text;
