//! The expansion of the field table in `abi.rs` into one module per API version: the version's
//! `#[repr(C)]` members, union and descriptor, and its [`Layout`], which writes an event into the
//! descriptor and reads it back field by field through the codecs the table names.
//!
//! A table row is `c_field [type in v1 … v6] Codec = event_field`, `-` where a version lacks the
//! field; without `= event_field` the codec is a [`CxCodec`](super::codec::CxCodec) (a field
//! that is not the event's). A member whose fields are all absent in a version is not in that
//! version's union. Members' padding is implicit: a descriptor starts all-zero (through the
//! union's `raw`) and is written one field at a time, so the padding stays zero.

use super::codec::{GetCx, PutCx};
use super::ApiVersion;
use crate::event::{EventDescr, EventType};
use std::ffi::{c_int, c_void};

/// One API version's event descriptor (`ncclProfilerEventDescr_vN_t`), generated from the
/// field table.
pub trait Layout: Sized {
    const VERSION: ApiVersion;

    /// An all-zero descriptor with this header; `None` when `type_` does not fit the version's
    /// `type` field (v1–v4 have a byte).
    fn header(type_: u64, parent_obj: *mut c_void, rank: c_int) -> Option<Self>;

    /// Writes the member of `ev`'s type; `false` when the version has no such type.
    fn put(&mut self, ev: &EventDescr<'_>, cx: &PutCx) -> bool;

    /// `type`, `rank` and `parentObj`.
    ///
    /// # Safety
    /// `d` points to a readable descriptor of this version.
    unsafe fn read_header(d: *const Self) -> (u64, c_int, *mut c_void);

    /// The event of type `t` (already checked to be one of the version's), with the header's
    /// `rank`; `None` only for a type the version has no member for.
    ///
    /// # Safety
    /// `d` points to a readable descriptor of this version whose member of type `t` is readable,
    /// with strings NULL or readable and a NetPlugin `data` NULL or of the size its id names.
    unsafe fn get<'a>(d: *const Self, t: EventType, rank: c_int, cx: &mut GetCx<'_, 'a>) -> Option<EventDescr<'a>>;
}

/// Expands the field table; see the module documentation for its rows.
macro_rules! abi_table {
    (
        versions { $( $(#[$vdoc:meta])* $v:ident = $V:ident, $ty:ident, $size:literal; )* }
        $(
            $(#[$mdoc:meta])*
            $m:ident: $Var:ident $(($hdr:ident))? { $($f:ident),* $(,)? } {
                $( $cf:ident [$($t:tt)*] $K:ident $(= $src:ident)? ),* $(,)?
            }
        )*
    ) => {
        $crate::nccl::table::abi_table!(@peel [$( [$(#[$vdoc])*] $v $V $ty $size ),*]
            $( [$(#[$mdoc])*] $m $Var ($($hdr)?) {$($f),*} [$( $cf [$($t)*] ($K $(= $src)?) ),*] )*
        );
    };

    // One version: the first column of every row; then the others.
    (@peel [] $($members:tt)*) => {};
    (@peel [ [$($vdoc:tt)*] $v:ident $V:ident $ty:ident $size:literal $(, $($vs:tt)*)? ]
        $( [$($mdoc:tt)*] $m:ident $Var:ident $hdr:tt $fs:tt [$( $cf:ident [$t:tt $($ts:tt)*] $how:tt ),*] )*
    ) => {
        $($vdoc)*
        pub mod $v {
            #[allow(unused_imports)]
            use super::*;
            $crate::nccl::table::abi_table!(@members [$v $V $ty $size; d ev cx rank t] [] [] []
                $( [$($mdoc)*] $m $Var $hdr $fs [$( $cf $t $how ),*] )*
            );
        }
        $crate::nccl::table::abi_table!(@peel [$($($vs)*)?]
            $( [$($mdoc)*] $m $Var $hdr $fs [$( $cf [$($ts)*] $how ),*] )*
        );
    };

    // Members, one at a time: a member with no field in this version is left out; one with
    // fields becomes a struct, a union field, a `put` arm and a `get` arm.
    (@members $state:tt $u:tt $p:tt $g:tt
        [$($mdoc:tt)*] $m:ident $Var:ident $hdr:tt $fs:tt [$( $cf:ident - $how:tt ),*]
        $($rest:tt)*
    ) => {
        $crate::nccl::table::abi_table!(@members $state $u $p $g $($rest)*);
    };
    (@members [$v:ident $V:ident $ty:ident $size:literal; $d:ident $ev:ident $cx:ident $rank:ident $t:ident]
        [$($u:tt)*] [$($p:tt)*] [$($g:tt)*]
        [$($mdoc:tt)*] $m:ident $Var:ident ($($hdr:ident)?) {$($f:ident),*}
        [$( $cf:ident $ct:tt ($($how:tt)*) ),*]
        $($rest:tt)*
    ) => {
        $crate::nccl::table::abi_table!(@struct [$($mdoc)*] $Var [] $( $cf $ct, )*);
        $crate::nccl::table::abi_table!(@members [$v $V $ty $size; $d $ev $cx $rank $t]
            [$($u)* pub $m: $Var,]
            [$($p)*
                $crate::event::EventDescr::$Var { $($hdr: _,)? $($f),* } => {
                    $( $crate::nccl::table::abi_table!(@put $ct; $d $m $cf $cx; $($how)*); )*
                    true
                }
            ]
            [$($g)*
                $crate::event::EventType::$Var => {
                    let m = ::core::ptr::addr_of!((*$d).u.$m);
                    $( let mut $f = None; )*
                    $( $crate::nccl::table::abi_table!(@get $ct; m $cf $cx; $($how)*); )*
                    $crate::event::EventDescr::$Var { $($hdr: $rank,)? $( $f: $f.unwrap_or_default() ),* }
                }
            ]
            $($rest)*
        );
    };
    (@members [$v:ident $V:ident $ty:ident $size:literal; $d:ident $ev:ident $cx:ident $rank:ident $t:ident]
        [$($u:tt)*] [$($p:tt)*] [$($g:tt)*]
    ) => {
        /// The descriptor's members; `raw` spans the union, so a descriptor can start all-zero.
        #[repr(C)]
        pub union Union {
            pub raw: [u64; ($size - 24) / 8],
            $($u)*
        }

        $crate::nccl::table::abi_table!(@descr $v $ty $size);

        impl $crate::nccl::table::Layout for Descr {
            const VERSION: $crate::nccl::ApiVersion = $crate::nccl::ApiVersion::$V;

            fn header(type_: u64, parent_obj: *mut ::std::ffi::c_void, rank: ::std::ffi::c_int) -> Option<Self> {
                #[allow(clippy::useless_conversion)] // a u64 `type` from v5 on
                let type_ = <$ty>::try_from(type_).ok()?;
                Some(Descr::new(type_, parent_obj, rank))
            }

            #[allow(unused_variables, unreachable_patterns)] // event fields the version lacks; v6 has every type
            fn put(&mut self, $ev: &$crate::event::EventDescr<'_>, $cx: &$crate::nccl::codec::PutCx) -> bool {
                let $d = self;
                match *$ev {
                    $($p)*
                    $crate::event::EventDescr::Group | $crate::event::EventDescr::ProxyCtrl => true,
                    _ => false,
                }
            }

            unsafe fn read_header($d: *const Self) -> (u64, ::std::ffi::c_int, *mut ::std::ffi::c_void) {
                // SAFETY: a readable descriptor (the caller's promise); plain integer fields.
                unsafe {
                    (
                        u64::from(::core::ptr::addr_of!((*$d).type_).read()),
                        ::core::ptr::addr_of!((*$d).rank).read(),
                        ::core::ptr::addr_of!((*$d).parent_obj).read(),
                    )
                }
            }

            #[allow(unused_mut, unreachable_patterns)] // event fields the version lacks; v6 has every type
            unsafe fn get<'a>(
                $d: *const Self,
                $t: $crate::event::EventType,
                $rank: ::std::ffi::c_int,
                $cx: &mut $crate::nccl::codec::GetCx<'_, 'a>,
            ) -> Option<$crate::event::EventDescr<'a>> {
                // SAFETY: the member of the type, read one field at a time (the caller's promise).
                let e = unsafe {
                    match $t {
                        $($g)*
                        $crate::event::EventType::Group => $crate::event::EventDescr::Group,
                        $crate::event::EventType::ProxyCtrl => $crate::event::EventDescr::ProxyCtrl,
                        _ => return None,
                    }
                };
                Some(e)
            }
        }
    };

    // A member's struct: the fields present in this version.
    (@struct [$($mdoc:tt)*] $Var:ident [$($acc:tt)*]) => {
        $($mdoc)*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct $Var {
            $($acc)*
        }
    };
    (@struct $mdoc:tt $Var:ident [$($acc:tt)*] $cf:ident -, $($rest:tt)*) => {
        $crate::nccl::table::abi_table!(@struct $mdoc $Var [$($acc)*] $($rest)*);
    };
    (@struct $mdoc:tt $Var:ident [$($acc:tt)*] $cf:ident $ct:tt, $($rest:tt)*) => {
        $crate::nccl::table::abi_table!(@struct $mdoc $Var [$($acc)* pub $cf: $ct,] $($rest)*);
    };

    // The header: `type` is a byte and 7 bytes of padding before v5, 64 bits from v5 on.
    (@descr $v:ident u8 $size:literal) => {
        $crate::nccl::table::abi_table!(@header $v u8 $size _pad0);
    };
    (@descr $v:ident u64 $size:literal) => {
        $crate::nccl::table::abi_table!(@header $v u64 $size);
    };
    (@header $v:ident $ty:ident $size:literal $($pad:ident)?) => {
        #[doc = concat!("`ncclProfilerEventDescr_", stringify!($v), "_t` (", stringify!($size), " bytes).")]
        #[repr(C)]
        pub struct Descr {
            pub type_: $ty,
            $(pub $pad: [u8; 7],)?
            pub parent_obj: *mut ::std::ffi::c_void,
            pub rank: ::std::ffi::c_int,
            pub _pad1: u32,
            pub u: Union,
        }

        impl Descr {
            /// An all-zero descriptor of type `type_`.
            pub fn new(type_: $ty, parent_obj: *mut ::std::ffi::c_void, rank: ::std::ffi::c_int) -> Descr {
                Descr { type_, $($pad: [0; 7],)? parent_obj, rank, _pad1: 0, u: Union { raw: [0; ($size - 24) / 8] } }
            }
        }
    };

    // One field written: from the event's value, or from the context.
    (@put - ; $($x:tt)*) => {};
    (@put $ct:tt; $d:ident $m:ident $cf:ident $cx:ident; $K:ident = $src:ident) => {
        $d.u.$m.$cf = <$crate::nccl::codec::$K as $crate::nccl::codec::Codec<_>>::put($src, $cx)
    };
    (@put $ct:tt; $d:ident $m:ident $cf:ident $cx:ident; $K:ident) => {
        $d.u.$m.$cf = <$crate::nccl::codec::$K as $crate::nccl::codec::CxCodec<_>>::put($cx)
    };

    // One field read: into the event's slot, or into the context.
    (@get - ; $($x:tt)*) => {};
    (@get $ct:tt; $mp:ident $cf:ident $cx:ident; $K:ident = $src:ident) => {
        <$crate::nccl::codec::$K as $crate::nccl::codec::Codec<_>>::get(
            ::core::ptr::addr_of!((*$mp).$cf).read(),
            $cx,
            &mut $src,
        )
    };
    (@get $ct:tt; $mp:ident $cf:ident $cx:ident; $K:ident) => {
        <$crate::nccl::codec::$K as $crate::nccl::codec::CxCodec<_>>::get(::core::ptr::addr_of!((*$mp).$cf).read(), $cx)
    };
}

pub(crate) use abi_table;
