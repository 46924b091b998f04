//! Generates virtsoc's GLES remoting from the Khronos registry (`gl.xml`) and our own
//! annotation file: the opcodes, the guest encoder, the host decoder and the entry-point
//! table (see `docs/gles.md`).
