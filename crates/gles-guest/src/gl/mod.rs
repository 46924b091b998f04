//! Guest-side GL (being written).
/// Guest-side GL state of one context (being written).
#[derive(Debug, Default)]
pub struct GlState;
