//! The core requests (everything but device commands), declared once for both sides, the way
//! `virtsoc-devapi` declares the devices' commands.
//!
//! Each declaration names the [`Opcode`], its typed arguments in wire order and its results.
//! From it come an argument struct per request with [`CoreOp::encode`] (the guest library
//! builds its ring entries with it) and [`CoreOp::decode`] (the host reads them back, every
//! word checked: a value that does not fit its type is `BadArgument`), a reply struct with
//! `to_values` / `from_values`, the host's [`CoreRequest`] enum and the [`CORE_OPS`] listing.
//! Device commands ([`Opcode::DeviceCmd`]) are declared per device in `virtsoc-devapi`.

use crate::wire::{AccessMode, Format, Opcode, Status};

/// A value carried in one request word.
pub trait WireWord: Sized + Copy {
    /// The word.
    fn to_word(self) -> u64;
    /// The value of a word from the guest; `BadArgument` when it does not fit.
    fn from_word(w: u64) -> Result<Self, Status>;
}

impl WireWord for u64 {
    fn to_word(self) -> u64 {
        self
    }
    fn from_word(w: u64) -> Result<Self, Status> {
        Ok(w)
    }
}

impl WireWord for u32 {
    fn to_word(self) -> u64 {
        u64::from(self)
    }
    fn from_word(w: u64) -> Result<Self, Status> {
        u32::try_from(w).map_err(|_| Status::BadArgument)
    }
}

impl WireWord for Format {
    fn to_word(self) -> u64 {
        self as u64
    }
    fn from_word(w: u64) -> Result<Self, Status> {
        u32::from_word(w).and_then(|v| Format::from_u32(v).ok_or(Status::BadArgument))
    }
}

impl WireWord for AccessMode {
    fn to_word(self) -> u64 {
        self as u64
    }
    fn from_word(w: u64) -> Result<Self, Status> {
        u32::from_word(w).and_then(|v| AccessMode::from_u32(v).ok_or(Status::BadArgument))
    }
}

/// A core request as the guest sends it.
pub trait CoreOp: Copy {
    /// Its opcode.
    const OPCODE: Opcode;
    /// What it returns.
    type Reply;
    /// The request's argument words.
    fn encode(&self) -> [u64; 6];
    /// Reads the argument words back (host side), each checked against its type.
    fn decode(args: &[u64; 6]) -> Result<Self, Status>;
    /// Decodes the completion values.
    fn reply(values: &[u64; 6]) -> Self::Reply;
}

/// One core request's declaration: name, argument names, result names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreOpInfo {
    /// The request's opcode.
    pub opcode: Opcode,
    /// The declaration's doc comment, one line per `///` line.
    pub doc: &'static str,
    /// Argument names in word order (at most six).
    pub args: &'static [&'static str],
    /// Completion value names in order (at most six).
    pub results: &'static [&'static str],
}

macro_rules! core_ops {
    ($(
        $(#[doc = $doc:literal])*
        $op:ident { $($arg:ident : $ty:ty),* $(,)? } -> $reply:ident { $($ret:ident),* $(,)? };
    )*) => {
        $(
            $(#[doc = $doc])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            pub struct $op {
                $(
                    #[doc = concat!(
                        "Argument `", stringify!($arg),
                        "` (one request word, in declaration order)."
                    )]
                    pub $arg: $ty
                ),*
            }

            #[doc = concat!("Results of [`", stringify!($op), "`].")]
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
            pub struct $reply {
                $(
                    #[doc = concat!(
                        "Completion value `", stringify!($ret), "` of `", stringify!($op),
                        "`, in declaration order."
                    )]
                    pub $ret: u64
                ),*
            }

            const _: () = assert!(<[&str]>::len(&[$(stringify!($arg)),*]) <= 6, "six words");
            const _: () = assert!(<[&str]>::len(&[$(stringify!($ret)),*]) <= 6, "six values");

            impl $reply {
                /// Encodes the completion values.
                pub fn to_values(&self) -> [u64; 6] {
                    let vals: &[u64] = &[$(self.$ret),*];
                    let mut out = [0u64; 6];
                    out[..vals.len()].copy_from_slice(vals);
                    out
                }

                /// Decodes completion values.
                #[allow(unused_variables, unused_mut)]
                pub fn from_values(v: &[u64; 6]) -> Self {
                    let mut it = v.iter().copied();
                    Self { $($ret: it.next().unwrap_or(0)),* }
                }
            }

            impl CoreOp for $op {
                const OPCODE: Opcode = Opcode::$op;
                type Reply = $reply;

                fn encode(&self) -> [u64; 6] {
                    let vals: &[u64] = &[$(WireWord::to_word(self.$arg)),*];
                    let mut out = [0u64; 6];
                    out[..vals.len()].copy_from_slice(vals);
                    out
                }

                #[allow(unused_variables, unused_mut)]
                fn decode(args: &[u64; 6]) -> Result<Self, Status> {
                    let mut it = args.iter().copied();
                    Ok($op { $($arg: <$ty as WireWord>::from_word(it.next().unwrap_or(0))?),* })
                }

                fn reply(values: &[u64; 6]) -> $reply {
                    $reply::from_values(values)
                }
            }
        )*

        /// A decoded core request (host side).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum CoreRequest {
            $( $(#[doc = $doc])* $op($op), )*
        }

        impl CoreRequest {
            /// Decodes a request's opcode and argument words: `UnknownOpcode` for an opcode
            /// that is no core request (device commands included), `BadArgument` for a word
            /// that does not fit its argument.
            pub fn decode(opcode: u32, args: &[u64; 6]) -> Result<CoreRequest, Status> {
                match Opcode::from_u32(opcode) {
                    $( Some(Opcode::$op) => Ok(CoreRequest::$op($op::decode(args)?)), )*
                    _ => Err(Status::UnknownOpcode),
                }
            }

            /// The range, mode and flags of either end of an access (the two carry the same
            /// arguments), `None` for any other request.
            pub fn access(&self) -> Option<BeginAccess> {
                match *self {
                    CoreRequest::BeginAccess(a) => Some(a),
                    CoreRequest::EndAccess(EndAccess { id, offset, len, mode, flags }) => {
                        Some(BeginAccess { id, offset, len, mode, flags })
                    }
                    _ => None,
                }
            }

            /// The request's opcode.
            pub fn opcode(&self) -> Opcode {
                match self {
                    $( CoreRequest::$op(_) => Opcode::$op, )*
                }
            }
        }

        /// Every core request's declaration, in opcode order.
        pub const CORE_OPS: &[CoreOpInfo] = &[
            $(
                CoreOpInfo {
                    opcode: Opcode::$op,
                    doc: concat!($($doc, "\n"),*),
                    args: &[$(stringify!($arg)),*],
                    results: &[$(stringify!($ret)),*],
                },
            )*
        ];
    };
}

core_ops! {
    /// Does nothing; measures the round trip.
    Nop {} -> NopReply {};
    /// Allocates a region: `size` bytes of [`Format::Blob`], or a `width` x `height` image of
    /// `format` (its size and stride follow from them). `usage`: informational bits.
    Alloc { size: u64, width: u32, height: u32, format: Format, usage: u32 }
        -> AllocReply { id, size, stride };
    /// Frees region `id`.
    Free { id: u64 } -> FreeReply {};
    /// Begins an access of `device` (the request's) to `[offset, offset + len)` of region
    /// `id`. For the CPU `window_offset` is where the first byte is in the window.
    BeginAccess { id: u64, offset: u64, len: u64, mode: AccessMode, flags: u64 }
        -> BeginAccessReply { window_offset, coherence_ns, copies, compensation_ns, host_ns, bytes };
    /// Ends an access begun with the same range and mode; `flags`:
    /// [`ACCESS_COMPENSATES`](crate::wire::ACCESS_COMPENSATES) when the guest blocks for
    /// the `compensation_ns` of the reply.
    EndAccess { id: u64, offset: u64, len: u64, mode: AccessMode, flags: u64 }
        -> EndAccessReply { window_offset, coherence_ns, copies, compensation_ns, host_ns, bytes };
    /// The guest's id, regions and bytes held.
    Stats {} -> StatsReply { guest, regions, bytes };
    /// Page `page` of the guest's [`Counters`](crate::counters::Counters) record, then of its
    /// copy ledger (see [`crate::counters`]).
    Counters { page: u64 } -> CountersReply { v0, v1, v2, v3, v4, v5 };
    /// Creates a virtual fence (index and generation packed in `fence`).
    FenceCreate {} -> FenceCreateReply { fence };
    /// Queued on the request's device: signals `fence` once the device's earlier commands
    /// completed (at once on the CPU).
    FenceSignal { fence: u64 } -> FenceSignalReply {};
    /// Queued on the request's device: holds its later commands until `fence` is signaled.
    FenceWait { fence: u64 } -> FenceWaitReply {};
    /// The guest no longer needs `fence`.
    FenceRelease { fence: u64 } -> FenceReleaseReply {};
    /// Whether `fence` was signaled (1), for fences outside the shared page.
    FenceStatus { fence: u64 } -> FenceStatusReply { signaled };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_but_device_commands_is_declared_once() {
        for op in Opcode::ALL {
            let n = CORE_OPS.iter().filter(|i| i.opcode == *op).count();
            let want = usize::from(!op.runs_device_command());
            assert_eq!(n, want, "{op:?}");
        }
    }

    /// The words sit where the host has always read them.
    #[test]
    fn the_wire_layout_is_kept() {
        let a = Alloc {
            size: 0,
            width: 64,
            height: 32,
            format: Format::Nv12,
            usage: 3,
        };
        assert_eq!(a.encode(), [0, 64, 32, 3, 3, 0]);
        let b = BeginAccess {
            id: 9,
            offset: 16,
            len: 8,
            mode: AccessMode::ReadWrite,
            flags: 1,
        };
        assert_eq!(b.encode(), [9, 16, 8, 3, 1, 0]);
        assert_eq!(FenceSignal { fence: 5 }.encode(), [5, 0, 0, 0, 0, 0]);
        let r = AllocReply {
            id: 1,
            size: 2,
            stride: 3,
        };
        assert_eq!(r.to_values(), [1, 2, 3, 0, 0, 0]);
        assert_eq!(Alloc::reply(&r.to_values()), r);
    }

    #[test]
    fn requests_round_trip_and_bad_words_are_refused() {
        let b = EndAccess {
            id: 9,
            offset: 16,
            len: 8,
            mode: AccessMode::Write,
            flags: 0,
        };
        assert_eq!(
            CoreRequest::decode(Opcode::EndAccess as u32, &b.encode()),
            Ok(CoreRequest::EndAccess(b))
        );
        let bad = |op: Opcode, args: [u64; 6]| CoreRequest::decode(op as u32, &args);
        assert_eq!(
            bad(Opcode::EndAccess, [9, 0, 8, 0, 0, 0]),
            Err(Status::BadArgument)
        );
        assert_eq!(
            bad(Opcode::EndAccess, [9, 0, 8, 1 << 32 | 1, 0, 0]),
            Err(Status::BadArgument)
        );
        assert_eq!(
            bad(Opcode::Alloc, [0, 1 << 32, 2, 1, 0, 0]),
            Err(Status::BadArgument)
        );
        assert_eq!(
            bad(Opcode::Alloc, [64, 0, 0, 99, 0, 0]),
            Err(Status::BadArgument)
        );
        assert_eq!(bad(Opcode::DeviceCmd, [0; 6]), Err(Status::UnknownOpcode));
        assert_eq!(
            CoreRequest::decode(999, &[0; 6]),
            Err(Status::UnknownOpcode)
        );
        assert_eq!(
            bad(Opcode::FenceStatus, [7, 0, 0, 0, 0, 0]).map(|r| r.opcode()),
            Ok(Opcode::FenceStatus)
        );
    }
}
