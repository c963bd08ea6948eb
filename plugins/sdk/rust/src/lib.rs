//! flowd plugin ABI, version 1, for guests written in Rust.
//!
//! `plugins/ABI.md` is the contract; this crate implements the parts every guest repeats.
//! It has no dependencies and needs neither `std` nor an allocator, so a guest builds with
//! `rustc` alone, as one file:
//!
//! ```text
//! /usr/bin/rustc --target wasm32-unknown-unknown --crate-type cdylib -O -C panic=abort \
//!     -C strip=symbols -C lto -C codegen-units=1 lib.rs
//! ```
//!
//! Use it either way:
//!
//! - included as a module: `#[path = "…/plugins/sdk/rust/src/lib.rs"] mod flowd;` (prefix
//!   it with `#[allow(unused_attributes)]`: `no_std` is a crate attribute, and the guest's
//!   own root says `#![no_std]`);
//! - as a crate: `plugins/sdk/rust` has a `Cargo.toml` (package `flowd-sdk`, crate `flowd`).
//!
//! What it gives a guest:
//!
//! - the exports every guest has, `flowd_abi_version` and `flowd_alloc` (the host's input
//!   buffer), defined here, and a panic handler that traps (a trapped instance is discarded);
//! - [`Records`], which decodes the filter and transform input checking every length against
//!   the input, so a malformed batch is [`Error::Input`], never a read past the input;
//! - [`prop`] and [`param`] to look a property or a parameter up;
//! - [`Buf`], a growable buffer in guest memory without an allocator, [`Bitmap`] for a
//!   filter's result and [`Out`] for a transform's;
//! - [`Assignment`], an allocator's input checked whole, with its queues, members and
//!   previous owners;
//! - [`filter`], [`transform`] and [`allocate`], which run the guest's function over a
//!   call's input and encode the result or the error code.
//!
//! Memory: buffers are carved from the end of linear memory with `memory.grow`. A buffer that
//! is the last one carved grows in place; otherwise a larger one is carved and the old one is
//! left unused. Buffers at least double when they grow, so the waste stays below the size of
//! the largest buffer. The host caps memory; past the cap `memory.grow` fails, and so do
//! `flowd_alloc` (0) and [`Buf::reserve`] ([`Error::NoMem`]).
#![no_std]

/// The ABI version this crate speaks; `flowd_abi_version` returns it.
pub const ABI_VERSION: i32 = 1;

/// The error codes of `plugins/ABI.md`, returned instead of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The guest failed for its own reason (-1).
    Generic,
    /// The input could not be decoded (-2).
    Input,
    /// The guest ran out of memory (-3).
    NoMem,
    /// A parameter is missing or invalid (-4).
    Params,
    /// The guest cannot handle this input (-5).
    Unsupported,
}

impl Error {
    /// The code the ABI gives this error.
    pub const fn code(self) -> i32 {
        match self {
            Error::Generic => -1,
            Error::Input => -2,
            Error::NoMem => -3,
            Error::Params => -4,
            Error::Unsupported => -5,
        }
    }
}

// ---- little-endian reads at any alignment ----

fn u16le(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn u32le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn u64le(b: &[u8]) -> u64 {
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// A cursor over input bytes whose every read is checked.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.rest.len() < n {
            return Err(Error::Input);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, Error> {
        Ok(u16le(self.take(2)?))
    }

    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32le(self.take(4)?))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64le(self.take(8)?))
    }

    fn str16(&mut self) -> Result<&'a [u8], Error> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    fn str32(&mut self) -> Result<&'a [u8], Error> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// The bytes the host wrote at `ptr`, `len` bytes long.
///
/// # Safety
///
/// `ptr` and `len` must be the arguments of a call from the host, which wrote the input
/// there, and the slice must not outlive the call.
#[allow(unused_unsafe)] // needed from edition 2024, redundant before
pub unsafe fn input<'a>(ptr: i32, len: i32) -> Result<&'a [u8], Error> {
    if ptr < 0 || len < 0 {
        return Err(Error::Input);
    }
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: the host wrote len bytes at ptr (the caller's contract).
    Ok(unsafe { core::slice::from_raw_parts(ptr as usize as *const u8, len as usize) })
}

// ---- message records (filter and transform input) ----

/// One message as a filter or transform receives it. The byte strings borrow the input and
/// are not necessarily UTF-8.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub queue_id: i32,
    pub queue_offset: i64,
    pub store_timestamp_ms: i64,
    pub topic: &'a [u8],
    pub tags: &'a [u8],
    /// Keys separated by one space: see [`keys`].
    pub keys: &'a [u8],
    /// RocketMQ's encoding, key 0x01 value 0x02 repeated: see [`prop`].
    pub props: &'a [u8],
    /// Empty unless the manifest asks for bodies (filter); always there for a transform.
    pub body: &'a [u8],
}

/// The `n` records of a filter or transform input. It yields `Err(Error::Input)` once and
/// stops when a length runs past its record or the input, the input ends before `n`
/// records, or bytes are left after them. Bytes after a record's last field and within its
/// `record_len` are skipped (later ABI versions may append fields).
pub struct Records<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Records<'a> {
    /// The records of `input`, which holds `n` of them.
    pub fn new(input: &'a [u8], n: i32) -> Result<Records<'a>, Error> {
        if n < 0 {
            return Err(Error::Input);
        }
        Ok(Records { rest: input, left: n as u32 })
    }

    fn decode(&mut self) -> Result<Record<'a>, Error> {
        let mut outer = Reader { rest: self.rest };
        let rlen = outer.u32()? as usize;
        let mut r = Reader { rest: outer.take(rlen)? };
        self.rest = outer.rest;
        Ok(Record {
            queue_id: r.u32()? as i32,
            queue_offset: r.u64()? as i64,
            store_timestamp_ms: r.u64()? as i64,
            topic: r.str16()?,
            tags: r.str16()?,
            keys: r.str16()?,
            props: r.str32()?,
            body: r.str32()?,
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            if self.rest.is_empty() {
                return None;
            }
            self.rest = &[];
            return Some(Err(Error::Input));
        }
        match self.decode() {
            Ok(rec) => {
                self.left -= 1;
                Some(Ok(rec))
            }
            Err(e) => {
                self.left = 0;
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// The index of the first byte equal to `c` in `hay`. It reads eight bytes at a time
/// (properties are scanned for every message, so this is a filter's inner loop).
pub fn find(hay: &[u8], c: u8) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let pattern = ONES * c as u64;
    let mut i = 0;
    while hay.len() - i >= 8 {
        let w = u64le(&hay[i..]) ^ pattern; // a zero byte where hay[i + k] == c
        let hit = w.wrapping_sub(ONES) & !w & HIGHS;
        if hit != 0 {
            return Some(i + (hit.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    hay[i..].iter().position(|&b| b == c).map(|k| i + k)
}

/// The value of the property named `key` in `props` (RocketMQ's encoding), if there is one.
/// A last pair without its 0x02 still counts (its value runs to the end), as RocketMQ's own
/// decoder reads it.
pub fn prop<'a>(props: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut rest = props;
    while !rest.is_empty() {
        let sep = find(rest, 0x01)?;
        let (name, after) = (&rest[..sep], &rest[sep + 1..]);
        let end = find(after, 0x02).unwrap_or(after.len());
        if name == key {
            return Some(&after[..end]);
        }
        rest = if end < after.len() { &after[end + 1..] } else { &[] };
    }
    None
}

/// The keys of a message's `keys` field, which separates them with one space.
pub fn keys(keys: &[u8]) -> impl Iterator<Item = &[u8]> {
    keys.split(|&b| b == b' ').filter(|k| !k.is_empty())
}

// ---- parameters (flowd_init input) ----

/// The value of the parameter named `key` in `flowd_init`'s input: `Ok(None)` when there is
/// none, `Err(Error::Input)` when the input does not decode. The value borrows the input
/// buffer, which the host reuses: copy what you keep (see [`Buf::copy_from`]).
pub fn param<'a>(input: &'a [u8], key: &[u8]) -> Result<Option<&'a [u8]>, Error> {
    let mut r = Reader { rest: input };
    let count = r.u32()?;
    let mut found = None;
    for _ in 0..count {
        let k = r.str16()?;
        let v = r.str32()?;
        if found.is_none() && k == key {
            found = Some(v);
        }
    }
    if !r.rest.is_empty() {
        return Err(Error::Input);
    }
    Ok(found)
}

// ---- memory ----

const PAGE: usize = 65536;

#[cfg(target_arch = "wasm32")]
fn memory_pages() -> usize {
    core::arch::wasm32::memory_size(0)
}

#[cfg(target_arch = "wasm32")]
fn memory_grow(pages: usize) -> bool {
    core::arch::wasm32::memory_grow(0, pages) != usize::MAX
}

#[cfg(not(target_arch = "wasm32"))]
fn memory_pages() -> usize {
    0
}

#[cfg(not(target_arch = "wasm32"))]
fn memory_grow(_pages: usize) -> bool {
    false
}

/// A growable buffer in guest memory, without an allocator. Keep it in a `static mut`: an
/// instance serves one call at a time.
pub struct Buf {
    ptr: usize,
    cap: usize,
}

impl Buf {
    /// An empty buffer; it takes memory on its first [`Buf::reserve`].
    pub const fn new() -> Buf {
        Buf { ptr: 0, cap: 0 }
    }

    /// Makes the buffer hold at least `size` bytes. Its contents are not kept when it moves.
    pub fn reserve(&mut self, size: usize) -> Result<(), Error> {
        if size <= self.cap {
            return Ok(());
        }
        let want = size.max(self.cap.saturating_mul(2)).max(1024);
        let end = memory_pages() * PAGE;
        let last = self.ptr != 0 && self.ptr + self.cap == end; // grow in place
        let extra = if last { want - self.cap } else { want };
        let pages = (extra + PAGE - 1) / PAGE;
        if pages > 32768 || !memory_grow(pages) {
            return Err(Error::NoMem);
        }
        if !last {
            self.ptr = end;
            self.cap = 0;
        }
        self.cap += pages * PAGE;
        Ok(())
    }

    /// The buffer's address in guest memory.
    pub fn addr(&self) -> usize {
        self.ptr
    }

    /// The buffer's first `len` bytes, which must be reserved.
    pub fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.cap);
        if len == 0 {
            return &mut [];
        }
        // SAFETY: reserve carved [ptr, ptr+cap) out of linear memory for this buffer alone.
        unsafe { core::slice::from_raw_parts_mut(self.ptr as *mut u8, len) }
    }

    /// Reserves `src.len()` bytes, copies `src` there and returns the copy.
    pub fn copy_from(&mut self, src: &[u8]) -> Result<&'static [u8], Error> {
        self.reserve(src.len())?;
        let dst = self.slice_mut(src.len());
        dst.copy_from_slice(src);
        // SAFETY: the buffer is never freed; it changes only through this Buf.
        Ok(unsafe { core::slice::from_raw_parts(dst.as_ptr(), dst.len()) })
    }
}

#[cfg(target_arch = "wasm32")]
static mut INPUT: Buf = Buf::new();

/// The ABI marker export.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub extern "C" fn flowd_abi_version() -> i32 {
    ABI_VERSION
}

/// The host's input buffer: `size` writable bytes, valid until the next call; 0 when out of
/// memory.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub extern "C" fn flowd_alloc(size: i32) -> i32 {
    if size < 0 {
        return 0;
    }
    // SAFETY: an instance serves one call at a time; INPUT is only touched here.
    let input = unsafe { &mut *core::ptr::addr_of_mut!(INPUT) };
    // Never 0 for a size of 0 either: 0 means out of memory.
    match input.reserve((size as usize).max(1)) {
        Ok(()) => input.addr() as i32,
        Err(_) => 0,
    }
}

#[cfg(all(target_arch = "wasm32", not(feature = "std")))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A trap: the host discards the instance and applies the module's fault policy.
    core::arch::wasm32::unreachable()
}

// ---- filter ----

/// A filter's result: one bit per message, set = keep.
pub struct Bitmap {
    buf: Buf,
}

impl Bitmap {
    pub const fn new() -> Bitmap {
        Bitmap { buf: Buf::new() }
    }

    /// Makes room for `n` messages, all dropped.
    pub fn reset(&mut self, n: usize) -> Result<(), Error> {
        let size = (n + 7) / 8;
        self.buf.reserve(size)?;
        self.buf.slice_mut(size).fill(0);
        Ok(())
    }

    /// Keeps message `i`.
    pub fn keep(&mut self, i: usize) {
        self.buf.slice_mut(i / 8 + 1)[i / 8] |= 1 << (i % 8);
    }

    /// The bitmap's address, the result of `flowd_filter`.
    pub fn addr(&self) -> i32 {
        self.buf.addr() as i32
    }
}

/// Runs `keep` over the `n` records at `ptr` and returns what `flowd_filter` returns: the
/// bitmap's address, or an error code (the first error `keep` returns, or
/// [`Error::Input`] for a malformed batch).
///
/// # Safety
///
/// As for [`input`]: the arguments of `flowd_filter`.
#[allow(unused_unsafe)] // needed from edition 2024, redundant before
pub unsafe fn filter<F>(bitmap: &mut Bitmap, ptr: i32, len: i32, n: i32, mut keep: F) -> i32
where
    F: FnMut(&Record) -> Result<bool, Error>,
{
    let mut run = || -> Result<i32, Error> {
        // SAFETY: the arguments of flowd_filter (the caller's contract).
        let records = Records::new(unsafe { input(ptr, len)? }, n)?;
        bitmap.reset(n as usize)?;
        for (i, rec) in records.enumerate() {
            if keep(&rec?)? {
                bitmap.keep(i);
            }
        }
        Ok(bitmap.addr())
    };
    match run() {
        Ok(addr) => addr,
        Err(e) => e.code(),
    }
}

// ---- transform ----

/// A transform's output being written.
pub struct Out {
    buf: Buf,
    len: usize,
    count_at: usize,
}

impl Out {
    pub const fn new() -> Out {
        Out { buf: Buf::new(), len: 0, count_at: 0 }
    }

    fn grow(&mut self, more: usize) -> Result<&mut [u8], Error> {
        let need = self.len.checked_add(more).filter(|&n| n <= i32::MAX as usize).ok_or(Error::NoMem)?;
        if need > self.buf.cap {
            let mut nb = Buf { ptr: self.buf.ptr, cap: self.buf.cap };
            nb.reserve(need)?;
            if nb.ptr != self.buf.ptr && self.len > 0 {
                // SAFETY: both ranges are carved buffers; a moved buffer does not overlap
                // the old one.
                unsafe { core::ptr::copy_nonoverlapping(self.buf.ptr as *const u8, nb.ptr as *mut u8, self.len) };
            }
            self.buf = nb;
        }
        let start = self.len;
        self.len = need;
        Ok(&mut self.buf.slice_mut(need)[start..])
    }

    fn begin(&mut self) -> Result<(), Error> {
        self.count_at = self.len;
        self.grow(4)?.copy_from_slice(&0u32.to_le_bytes());
        Ok(())
    }

    /// Appends one message out for the current message in.
    pub fn message(&mut self, tags: &[u8], keys: &[u8], props: &[u8], body: &[u8]) -> Result<(), Error> {
        if tags.len() > 0xffff || keys.len() > 0xffff {
            return Err(Error::Input);
        }
        let size = (2 + tags.len() + 2 + keys.len() + 4)
            .checked_add(props.len())
            .and_then(|s| s.checked_add(4 + body.len()))
            .ok_or(Error::NoMem)?;
        let mut w = self.grow(size)?;
        for (hdr, field) in [(2usize, tags), (2, keys), (4, props), (4, body)] {
            let (h, rest) = w.split_at_mut(hdr);
            h.copy_from_slice(&(field.len() as u32).to_le_bytes()[..hdr]);
            let (f, rest) = rest.split_at_mut(field.len());
            f.copy_from_slice(field);
            w = rest;
        }
        let at = self.count_at;
        let c = self.buf.slice_mut(at + 4);
        let count = u32le(&c[at..]) + 1;
        c[at..].copy_from_slice(&count.to_le_bytes());
        Ok(())
    }
}

// ---- allocator ----

/// One queue of an allocator's input.
#[derive(Clone, Copy, Debug)]
pub struct Queue<'a> {
    pub topic: &'a [u8],
    pub broker: &'a [u8],
    pub queue_id: i32,
}

/// One member of an allocator's input.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    pub id: &'a [u8],
    /// 1 when the host knows nothing else.
    pub weight: u32,
    /// Empty when the host knows nothing else.
    pub room: &'a [u8],
    nlabels: u32,
    labels: &'a [u8],
}

impl<'a> Member<'a> {
    /// The member's labels, sorted by key.
    pub fn labels(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        let mut r = Reader { rest: self.labels };
        // Checked by Assignment::decode.
        (0..self.nlabels).map(move |_| (r.str16().unwrap_or(&[]), r.str16().unwrap_or(&[])))
    }

    /// The value of the label `key`, if the member has it.
    pub fn label(&self, key: &[u8]) -> Option<&'a [u8]> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// An allocator's input, checked whole by [`Assignment::decode`].
pub struct Assignment<'a> {
    pub group: &'a [u8],
    /// The number of queues.
    pub nq: u32,
    queues: &'a [u8],
    /// The number of members.
    pub nm: u32,
    members: &'a [u8],
    previous: &'a [u8],
}

impl<'a> Assignment<'a> {
    /// Checks and splits `flowd_allocate`'s input: [`Error::Input`] for a length past the
    /// input, a previous assignment of neither 0 nor `nq` entries, or bytes left over.
    pub fn decode(input: &'a [u8]) -> Result<Assignment<'a>, Error> {
        let mut r = Reader { rest: input };
        let group = r.str16()?;
        let nq = r.u32()?;
        let start = r.rest;
        for _ in 0..nq {
            r.str16()?;
            r.str16()?;
            r.u32()?;
        }
        let queues = &start[..start.len() - r.rest.len()];
        let nm = r.u32()?;
        let start = r.rest;
        for _ in 0..nm {
            r.str16()?;
            r.u32()?;
            r.str16()?;
            for _ in 0..r.u32()? {
                r.str16()?;
                r.str16()?;
            }
        }
        let members = &start[..start.len() - r.rest.len()];
        let np = r.u32()?;
        if np != 0 && np != nq {
            return Err(Error::Input);
        }
        let previous = r.take(np as usize * 4)?;
        if !r.rest.is_empty() {
            return Err(Error::Input);
        }
        Ok(Assignment { group, nq, queues, nm, members, previous })
    }

    /// The queues, in the input's order (queue k of the output is the k-th).
    pub fn queues(&self) -> impl Iterator<Item = Queue<'a>> {
        let mut r = Reader { rest: self.queues };
        (0..self.nq).map(move |_| Queue {
            topic: r.str16().unwrap_or(&[]),
            broker: r.str16().unwrap_or(&[]),
            queue_id: r.u32().unwrap_or(0) as i32,
        })
    }

    /// The members, in the input's order (sorted by id; a member's index is its position).
    pub fn members(&self) -> impl Iterator<Item = Member<'a>> {
        let mut r = Reader { rest: self.members };
        (0..self.nm).map(move |_| {
            let id = r.str16().unwrap_or(&[]);
            let weight = r.u32().unwrap_or(0);
            let room = r.str16().unwrap_or(&[]);
            let nlabels = r.u32().unwrap_or(0);
            let start = r.rest;
            for _ in 0..nlabels {
                let _ = r.str16();
                let _ = r.str16();
            }
            let labels = &start[..start.len() - r.rest.len()];
            Member { id, weight, room, nlabels, labels }
        })
    }

    /// The previous owner of queue `k`, a member index, or -1 for none (also when there is
    /// no previous assignment).
    pub fn previous(&self, k: usize) -> i32 {
        match self.previous.get(k * 4..k * 4 + 4) {
            Some(b) => u32le(b) as i32,
            None => -1,
        }
    }
}

/// Runs `assign` over `flowd_allocate`'s input and returns what `flowd_allocate` returns:
/// the packed owners (`assign` fills `owners[k]` with the member index owning queue `k`;
/// every entry starts at 0), or an error code.
///
/// # Safety
///
/// As for [`input`]: the arguments of `flowd_allocate`.
#[allow(unused_unsafe)] // needed from edition 2024, redundant before
pub unsafe fn allocate<F>(out: &mut Buf, ptr: i32, len: i32, mut assign: F) -> i64
where
    F: FnMut(&Assignment, &mut [i32]) -> Result<(), Error>,
{
    let mut run = || -> Result<i64, Error> {
        // SAFETY: the arguments of flowd_allocate (the caller's contract).
        let a = Assignment::decode(unsafe { input(ptr, len)? })?;
        let size = (a.nq as usize).checked_mul(4).filter(|&s| s <= i32::MAX as usize).ok_or(Error::NoMem)?;
        out.reserve(size.max(1))?;
        let bytes = out.slice_mut(size);
        bytes.fill(0);
        // SAFETY: the buffer's address is a multiple of the page size, so aligned for i32.
        let owners = unsafe { core::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut i32, a.nq as usize) };
        assign(&a, owners)?;
        Ok(pack(out.addr(), size))
    };
    match run() {
        Ok(packed) => packed,
        Err(e) => e.code() as i64,
    }
}

/// Packs a result of `flowd_transform` or `flowd_allocate`: `(ptr << 32) | len`.
pub fn pack(ptr: usize, len: usize) -> i64 {
    ((ptr as u64) << 32 | len as u64) as i64
}

/// Runs `each` over the `n` records at `ptr`, each call writing the messages out for one
/// message in (none drops it), and returns what `flowd_transform` returns: the packed
/// output, or an error code.
///
/// # Safety
///
/// As for [`input`]: the arguments of `flowd_transform`.
#[allow(unused_unsafe)] // needed from edition 2024, redundant before
pub unsafe fn transform<F>(out: &mut Out, ptr: i32, len: i32, n: i32, mut each: F) -> i64
where
    F: FnMut(&Record, &mut Out) -> Result<(), Error>,
{
    out.len = 0;
    let mut run = || -> Result<i64, Error> {
        // SAFETY: the arguments of flowd_transform (the caller's contract).
        for rec in Records::new(unsafe { input(ptr, len)? }, n)? {
            let rec = rec?;
            out.begin()?;
            each(&rec, out)?;
        }
        Ok(pack(out.buf.addr(), out.len))
    };
    match run() {
        Ok(packed) => packed,
        Err(e) => e.code() as i64,
    }
}
