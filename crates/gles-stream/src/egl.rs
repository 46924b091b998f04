//! Opcodes of the EGL and virtsoc commands that travel in the stream beside the GL calls
//! (GL opcodes are generated and stay below [`BASE`]). Payloads are documented per opcode.

/// First opcode of this range.
pub const BASE: u32 = 0x1_0000;
/// `ctx u32`: the following packets run on guest context `ctx` (0: none).
pub const SET_CONTEXT: u32 = BASE;
