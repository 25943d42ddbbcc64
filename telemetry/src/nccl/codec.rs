//! How one field of a descriptor crosses the ABI, both ways: a marker type per kind of value
//! (a function name, an address, a flag …) implements [`Codec`] for every C type that kind has in
//! some version, so the field table (`abi.rs`) names the kind once and each version's C type picks
//! the conversion (a function name is a `u8` code in v1 and a string from v2 on).
//!
//! Writing fills a zeroed descriptor from occl's event. Reading trusts nothing a host passes
//! beyond the pointers being readable: strings are bounded and checked, handles go through the
//! caller's table, a net payload is read only when its id tells its size. A read value goes into
//! a slot of the event being rebuilt; a field that carries nothing back (v1's `isCollnet`) leaves
//! it alone.

use super::names::{self, Field};
use crate::event::EventId;
use std::ffi::{c_char, c_int, c_void};
use std::ptr;

/// A string longer than this (without its NUL) is not one of NCCL's names; it reads "Unknown"
/// and nothing past it is read.
pub const MAX_NAME: usize = 256;
/// The same bound for a communicator name (`commName`, v1–v3 `coll.name`): an application's
/// string, so allowed to be longer.
pub const MAX_COMM_NAME: usize = 1024;

const UNKNOWN: &str = "Unknown";

/// The communicator fields of a v1–v3 Coll or P2p descriptor (NCCL 2.23–2.26 fill them; 2.27+
/// passes NULL and 0 to these versions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommFields<'a> {
    pub name: Option<&'a str>,
    pub hash: u64,
}

/// What writing a descriptor needs beyond the event: the values of the fields that are not the
/// event's own.
#[derive(Clone, Copy, Debug)]
pub struct PutCx {
    /// v1–v3 `name` and `commHash`.
    pub(crate) comm_name: *const c_char,
    pub(crate) comm_hash: u64,
    /// v5+ `parentGroup`: the plugin's handle of the event's legacy Group.
    pub(crate) group: *mut c_void,
}

/// What reading a descriptor needs beyond its bytes, and what it finds outside the event.
pub struct GetCx<'h, 'a> {
    /// The caller's handle table: an event id for a handle it issued.
    pub(crate) handles: &'h dyn Fn(usize) -> Option<EventId>,
    /// The NetPlugin id read so far: it tells the payload's size.
    pub(crate) net_id: i64,
    /// v1–v3 Coll/P2p communicator fields, when the member had them.
    pub(crate) comm: Option<CommFields<'a>>,
}

impl<'h, 'a> GetCx<'h, 'a> {
    pub(crate) fn new(handles: &'h dyn Fn(usize) -> Option<EventId>) -> Self {
        GetCx { handles, net_id: 0, comm: None }
    }

    fn comm(&mut self) -> &mut CommFields<'a> {
        self.comm.get_or_insert(CommFields { name: None, hash: 0 })
    }
}

/// A field holding one of the event's values.
pub(crate) trait Codec<C> {
    /// The value as the event holds it.
    type Value<'a>;

    fn put(v: Self::Value<'_>, cx: &PutCx) -> C;

    /// Puts the value `c` holds into `slot`.
    ///
    /// # Safety
    /// A pointer `c` is NULL or readable as the field's contract says (strings up to their NUL
    /// or the name bound, payloads of the size their id names).
    unsafe fn get<'a>(c: C, cx: &mut GetCx<'_, 'a>, slot: &mut Option<Self::Value<'a>>);
}

/// A field whose value is not the event's: the communicator's, or nobody's.
pub(crate) trait CxCodec<C> {
    fn put(cx: &PutCx) -> C;

    /// # Safety
    /// As [`Codec::get`].
    unsafe fn get<'a>(c: C, cx: &mut GetCx<'_, 'a>);
}

/// An integer as it is.
pub(crate) struct Int;
/// An address (`usize` in the event).
pub(crate) struct Addr;
/// A C `bool` (`u8`) or an `int` flag.
pub(crate) struct Flag;
/// One of NCCL's names, of the [`Field`] the marker says: a v1 code or a C string.
pub(crate) struct Func;
pub(crate) struct Datatype;
pub(crate) struct Algo;
pub(crate) struct Proto;
pub(crate) struct SyncStrategy;
/// v1 `isCollnet` / `isNvls`: written from the algorithm, read back as nothing.
pub(crate) struct IsCollnet;
pub(crate) struct IsNvls;
/// `parentGroup`: the handle [`PutCx`] holds; read through the handle table.
pub(crate) struct Handle;
/// NetPlugin `id`, which the payload after it is read by.
pub(crate) struct NetId;
/// NetPlugin `data`: the payload's bytes.
pub(crate) struct Payload;
/// v1–v3 `name` / `commHash`.
pub(crate) struct CommName;
pub(crate) struct CommHash;
/// A field occl never fills (v1 `op`, v1–v2 `trafficBytes`): zero, and ignored when read.
pub(crate) struct Zero;

impl<T: Copy> Codec<T> for Int {
    type Value<'a> = T;
    fn put(v: T, _: &PutCx) -> T {
        v
    }
    unsafe fn get(c: T, _: &mut GetCx<'_, '_>, slot: &mut Option<T>) {
        *slot = Some(c);
    }
}

impl Codec<*const c_void> for Addr {
    type Value<'a> = usize;
    fn put(v: usize, _: &PutCx) -> *const c_void {
        v as *const c_void
    }
    unsafe fn get(c: *const c_void, _: &mut GetCx<'_, '_>, slot: &mut Option<usize>) {
        *slot = Some(c as usize);
    }
}

impl Codec<*mut c_void> for Addr {
    type Value<'a> = usize;
    fn put(v: usize, _: &PutCx) -> *mut c_void {
        v as *mut c_void
    }
    unsafe fn get(c: *mut c_void, _: &mut GetCx<'_, '_>, slot: &mut Option<usize>) {
        *slot = Some(c as usize);
    }
}

impl Codec<u8> for Flag {
    type Value<'a> = bool;
    fn put(v: bool, _: &PutCx) -> u8 {
        u8::from(v)
    }
    unsafe fn get(c: u8, _: &mut GetCx<'_, '_>, slot: &mut Option<bool>) {
        *slot = Some(c != 0);
    }
}

impl Codec<c_int> for Flag {
    type Value<'a> = bool;
    fn put(v: bool, _: &PutCx) -> c_int {
        c_int::from(v)
    }
    unsafe fn get(c: c_int, _: &mut GetCx<'_, '_>, slot: &mut Option<bool>) {
        *slot = Some(c != 0);
    }
}

/// The markers of NCCL's names.
pub(crate) trait Named {
    const FIELD: Field;
}

impl Named for Func {
    const FIELD: Field = Field::Func;
}
impl Named for Datatype {
    const FIELD: Field = Field::Datatype;
}
impl Named for Algo {
    const FIELD: Field = Field::Algo;
}
impl Named for Proto {
    const FIELD: Field = Field::Proto;
}
impl Named for SyncStrategy {
    const FIELD: Field = Field::SyncStrategy;
}

/// v1: a code; "Unknown" for a code v1 did not have.
impl<N: Named> Codec<u8> for N {
    type Value<'a> = &'a str;
    fn put(v: &str, _: &PutCx) -> u8 {
        names::code(N::FIELD, v)
    }
    unsafe fn get<'a>(c: u8, _: &mut GetCx<'_, 'a>, slot: &mut Option<&'a str>) {
        *slot = Some(names::of_code(N::FIELD, c));
    }
}

/// v2+: a static C string of NCCL's spelling.
impl<N: Named> Codec<*const c_char> for N {
    type Value<'a> = &'a str;
    fn put(v: &str, _: &PutCx) -> *const c_char {
        names::c_str(N::FIELD, v).as_ptr()
    }
    unsafe fn get<'a>(c: *const c_char, _: &mut GetCx<'_, 'a>, slot: &mut Option<&'a str>) {
        // SAFETY: the caller's promise.
        *slot = Some(unsafe { name(c) });
    }
}

impl Codec<c_int> for IsCollnet {
    type Value<'a> = &'a str;
    fn put(algo: &str, _: &PutCx) -> c_int {
        c_int::from(names::is_collnet(algo))
    }
    unsafe fn get(_: c_int, _: &mut GetCx<'_, '_>, _: &mut Option<&str>) {}
}

impl Codec<c_int> for IsNvls {
    type Value<'a> = &'a str;
    fn put(algo: &str, _: &PutCx) -> c_int {
        c_int::from(names::is_nvls(algo))
    }
    unsafe fn get(_: c_int, _: &mut GetCx<'_, '_>, _: &mut Option<&str>) {}
}

impl Codec<*mut c_void> for Handle {
    type Value<'a> = Option<EventId>;
    fn put(_: Option<EventId>, cx: &PutCx) -> *mut c_void {
        cx.group
    }
    unsafe fn get(c: *mut c_void, cx: &mut GetCx<'_, '_>, slot: &mut Option<Option<EventId>>) {
        *slot = Some(handle(c as usize, cx.handles));
    }
}

impl Codec<i64> for NetId {
    type Value<'a> = i64;
    fn put(v: i64, _: &PutCx) -> i64 {
        v
    }
    unsafe fn get(c: i64, cx: &mut GetCx<'_, '_>, slot: &mut Option<i64>) {
        cx.net_id = c;
        *slot = Some(c);
    }
}

impl Codec<*mut c_void> for Payload {
    type Value<'a> = &'a [u8];
    fn put(v: &[u8], _: &PutCx) -> *mut c_void {
        payload_ptr(v)
    }
    unsafe fn get<'a>(c: *mut c_void, cx: &mut GetCx<'_, 'a>, slot: &mut Option<&'a [u8]>) {
        let len = if c.is_null() { 0 } else { net_payload_len(cx.net_id) };
        // SAFETY: non-NULL data holds the payload its id names (the caller's promise).
        *slot = Some(if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(c.cast::<u8>(), len) } });
    }
}

impl CxCodec<*const c_char> for CommName {
    fn put(cx: &PutCx) -> *const c_char {
        cx.comm_name
    }
    unsafe fn get(c: *const c_char, cx: &mut GetCx<'_, '_>) {
        // SAFETY: the caller's promise.
        cx.comm().name = unsafe { comm_name(c) };
    }
}

impl CxCodec<u64> for CommHash {
    fn put(cx: &PutCx) -> u64 {
        cx.comm_hash
    }
    unsafe fn get(c: u64, cx: &mut GetCx<'_, '_>) {
        cx.comm().hash = c;
    }
}

impl<C: Default> CxCodec<C> for Zero {
    fn put(_: &PutCx) -> C {
        C::default()
    }
    unsafe fn get(_: C, _: &mut GetCx<'_, '_>) {}
}

/// A payload as the host passes it: NULL when empty.
pub(crate) fn payload_ptr(d: &[u8]) -> *mut c_void {
    if d.is_empty() {
        ptr::null_mut()
    } else {
        d.as_ptr().cast_mut().cast()
    }
}

/// A handle of the caller's, or `None` for NULL.
pub(crate) fn handle(h: usize, handles: &dyn Fn(usize) -> Option<EventId>) -> Option<EventId> {
    if h == 0 {
        None
    } else {
        handles(h)
    }
}

/// Bytes up to the NUL, if there is one within `max`.
///
/// # Safety
/// `p` is non-NULL and readable up to its NUL or `max` bytes, whichever comes first.
unsafe fn bounded<'a>(p: *const c_char, max: usize) -> Option<&'a [u8]> {
    let mut n = 0;
    // SAFETY: each byte read is at or before the first NUL and within `max` (caller's promise).
    while n < max && unsafe { p.add(n).read() } != 0 {
        n += 1;
    }
    // SAFETY: the `n` bytes were just read.
    (n < max).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// One of NCCL's names: "Unknown" when NULL, too long or not UTF-8.
///
/// # Safety
/// `p` is NULL or a string readable up to its NUL or [`MAX_NAME`] bytes.
pub unsafe fn name<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return UNKNOWN;
    }
    // SAFETY: the caller's promise.
    unsafe { bounded(p, MAX_NAME) }.and_then(|b| std::str::from_utf8(b).ok()).unwrap_or(UNKNOWN)
}

/// A communicator name: `None` when NULL, "Unknown" when too long or not UTF-8.
///
/// # Safety
/// `p` is NULL or a string readable up to its NUL or [`MAX_COMM_NAME`] bytes.
pub unsafe fn comm_name<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { bounded(p, MAX_COMM_NAME) }.and_then(|b| std::str::from_utf8(b).ok()).unwrap_or(UNKNOWN))
}

/// Bytes of a NetPlugin payload, known from its id: version 1 of NCCL's IB (net type 1, 40
/// bytes) and socket (net type 2, 24 bytes) payloads. Any other payload's size is not in the
/// ABI, so it is not read (0).
pub fn net_payload_len(id: i64) -> usize {
    match ((id >> 16) & 0xffff, id & 0xffff) {
        (1, 1) => 40,
        (2, 1) => 24,
        _ => 0,
    }
}
