//! The `devices!` macro: one declaration per device command set.
//!
//! ```text
//! /// doc
//! device codec = 10 {
//!     /// doc
//!     fn decode(handle: handle, bitstream: region_r, len: u64, frame: region_w) -> (got, pts) = 2;
//!     fn open(kind: u64) -> (handle: handle) = 1;
//! }
//! ```
//!
//! Argument kinds: `u64` (a plain value), `handle` (an object of this guest on this device,
//! a [`crate::HandleId`] field), `region_r`, `region_w`, `region_rw` (an SVM region the command
//! reads, writes or both, a [`crate::RegionId`] field). A result is a `u64` unless declared
//! `name: handle` (a `HandleId`). At most five arguments and six results. For each command
//! the macro generates a struct with the arguments (implementing [`crate::DeviceCommand`]:
//! wire encoding, the regions it touches), a reply struct, a host-side `Command` enum
//! decoding the wire words, and the [`crate::DeviceInfo`] metadata that listings and the C
//! header come from. The wire carries every argument and result as one word: the generated
//! encoding and decoding are the only places the typed ids become words and back.

/// The field type of an argument kind: the wire word decoded into its typed id.
#[doc(hidden)]
#[macro_export]
macro_rules! __arg_type {
    (u64) => {
        u64
    };
    (handle) => {
        $crate::HandleId
    };
    (region_r) => {
        $crate::RegionId
    };
    (region_w) => {
        $crate::RegionId
    };
    (region_rw) => {
        $crate::RegionId
    };
}

/// The field type of a result: `u64` unless declared `name: handle`.
#[doc(hidden)]
#[macro_export]
macro_rules! __ret_type {
    () => {
        u64
    };
    (handle) => {
        $crate::HandleId
    };
}

/// Access mode of a region argument kind, `None` for plain values.
#[doc(hidden)]
#[macro_export]
macro_rules! __region_mode {
    (u64) => {
        None
    };
    (handle) => {
        None
    };
    (region_r) => {
        Some($crate::AccessMode::Read)
    };
    (region_w) => {
        Some($crate::AccessMode::Write)
    };
    (region_rw) => {
        Some($crate::AccessMode::ReadWrite)
    };
}

/// The [`crate::ArgKind`] of an argument kind.
#[doc(hidden)]
#[macro_export]
macro_rules! __arg_kind {
    (u64) => {
        $crate::ArgKind::Value
    };
    (handle) => {
        $crate::ArgKind::Handle
    };
    ($region:ident) => {
        match $crate::__region_mode!($region) {
            Some(m) => $crate::ArgKind::Region(m),
            None => $crate::ArgKind::Value,
        }
    };
}

/// What an argument kind carries, for the generated field docs.
#[doc(hidden)]
#[macro_export]
macro_rules! __kind_doc {
    (u64) => {
        "a plain value."
    };
    (handle) => {
        "a handle of an object this guest opened on this device."
    };
    (region_r) => {
        "id of an SVM region the command reads."
    };
    (region_w) => {
        "id of an SVM region the command writes."
    };
    (region_rw) => {
        "id of an SVM region the command reads and writes."
    };
}

/// Declares devices; see the module docs.
#[macro_export]
macro_rules! devices {
    ($(
        $(#[doc = $ddoc:literal])*
        device $dev:ident = $id:literal {
            $(
                $(#[doc = $cdoc:literal])*
                fn $cmd:ident ( $($arg:ident : $kind:ident),* $(,)? ) -> ( $($ret:ident $(: $rkind:ident)?),* $(,)? ) = $op:literal;
            )*
        }
    )*) => {
        $(
            $(#[doc = $ddoc])*
            pub mod $dev {
                #![allow(clippy::needless_update, unused_mut, unused_variables)]
                use $crate::{AccessMode, DeviceCommand, DeviceId, RegionId, Status};

                /// The device's id in requests.
                pub const ID: DeviceId = DeviceId($id);

                $crate::paste::paste! {
                    $(
                        $(#[doc = $cdoc])*
                        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
                        pub struct [<$cmd:camel>] {
                            $(
                                #[doc = concat!(
                                    "Argument `", stringify!($arg), "`: ",
                                    $crate::__kind_doc!($kind)
                                )]
                                pub $arg: $crate::__arg_type!($kind)
                            ),*
                        }

                        #[doc = concat!("Results of `", stringify!($cmd), "`.")]
                        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
                        pub struct [<$cmd:camel Reply>] {
                            $(
                                #[doc = concat!(
                                    "Result `", stringify!($ret), "` of `", stringify!($cmd),
                                    "` (a completion value, in declaration order)."
                                )]
                                pub $ret: $crate::__ret_type!($($rkind)?)
                            ),*
                        }

                        impl [<$cmd:camel Reply>] {
                            /// Decodes completion values.
                            pub fn from_values(v: &[u64; 6]) -> Self {
                                let mut it = v.iter().copied();
                                Self { $($ret: it.next().unwrap_or(0).into()),* }
                            }

                            /// Encodes completion values.
                            pub fn to_values(&self) -> [u64; 6] {
                                let mut out = [0u64; 6];
                                let vals: &[u64] = &[$(u64::from(self.$ret)),*];
                                out[..vals.len()].copy_from_slice(vals);
                                out
                            }
                        }

                        const _: () = assert!(<[&str]>::len(&[$(stringify!($arg)),*]) <= 5, "at most five arguments");
                        const _: () = assert!(<[&str]>::len(&[$(stringify!($ret)),*]) <= 6, "at most six results");

                        impl DeviceCommand for [<$cmd:camel>] {
                            const DEVICE: DeviceId = ID;
                            const OP: u64 = $op;
                            const NAME: &'static str = stringify!($cmd);
                            type Reply = [<$cmd:camel Reply>];

                            fn encode(&self) -> [u64; 6] {
                                let mut out = [0u64; 6];
                                out[0] = $op;
                                let vals: &[u64] = &[$(u64::from(self.$arg)),*];
                                out[1..1 + vals.len()].copy_from_slice(vals);
                                out
                            }

                            fn regions(&self) -> Vec<(RegionId, AccessMode)> {
                                let all: &[(u64, Option<AccessMode>)] =
                                    &[$((u64::from(self.$arg), $crate::__region_mode!($kind))),*];
                                all.iter().filter_map(|(id, m)| m.map(|m| (RegionId(*id), m))).collect()
                            }

                            fn reply(values: &[u64; 6]) -> Self::Reply {
                                [<$cmd:camel Reply>]::from_values(values)
                            }
                        }
                    )*

                    /// A decoded command of this device (host side).
                    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
                    pub enum Command {
                        $(
                            #[doc = concat!("A `", stringify!($cmd), "` request.")]
                            [<$cmd:camel>]([<$cmd:camel>]),
                        )*
                    }

                    impl Command {
                        /// Decodes request words; unknown opcodes are an error.
                        pub fn decode(args: &[u64; 6]) -> Result<Command, Status> {
                            match args[0] {
                                $(
                                    $op => {
                                        let mut it = args[1..].iter().copied();
                                        Ok(Command::[<$cmd:camel>]([<$cmd:camel>] {
                                            $($arg: it.next().unwrap_or(0).into()),*
                                        }))
                                    }
                                )*
                                _ => Err(Status::UnknownOpcode),
                            }
                        }

                        /// The regions the command names, with how it uses them.
                        pub fn regions(&self) -> Vec<(RegionId, AccessMode)> {
                            match self {
                                $( Command::[<$cmd:camel>](c) => c.regions(), )*
                            }
                        }

                        /// The command's name.
                        pub fn name(&self) -> &'static str {
                            match self {
                                $( Command::[<$cmd:camel>](_) => stringify!($cmd), )*
                            }
                        }
                    }
                }

                /// Metadata of this device's commands.
                pub const INFO: $crate::DeviceInfo = $crate::DeviceInfo {
                    name: stringify!($dev),
                    id: ID,
                    doc: concat!($($ddoc, "\n"),*),
                    commands: &[
                        $(
                            $crate::CommandInfo {
                                name: stringify!($cmd),
                                op: $op,
                                doc: concat!($($cdoc, "\n"),*),
                                args: &[$($crate::ArgInfo {
                                    name: stringify!($arg),
                                    kind: $crate::__arg_kind!($kind),
                                }),*],
                                results: &[$(stringify!($ret)),*],
                            },
                        )*
                    ],
                };
            }
        )*

        /// Every declared device.
        pub const ALL: &[$crate::DeviceInfo] = &[$( $dev::INFO ),*];
    };
}
