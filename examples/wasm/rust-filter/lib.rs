//! rust-filter: a flowd filter that keeps the messages whose tag is one of a list, as a
//! RocketMQ tag subscription does. The parameter `tags` is the list in RocketMQ's syntax,
//! `TagA || TagB` (spaces around each tag are ignored); `*` keeps every message. A message
//! without a tag is kept only by `*`. Without the parameter, or with an empty list,
//! `flowd_init` and a filter call made without it return `FLOWD_ERR_PARAMS`.
#![no_std]

#[allow(unused_attributes, dead_code)]
#[path = "../../../plugins/sdk/rust/src/lib.rs"]
mod flowd;

use flowd::{Bitmap, Buf, Error};

/// The configured tags, each as u16 length then bytes (a copy: the parameters' buffer is the
/// host's).
static mut TAGS: &[u8] = &[];
static mut TAGS_BUF: Buf = Buf::new();
static mut ALL: bool = false;
static mut CONFIGURED: bool = false;
static mut BITMAP: Bitmap = Bitmap::new();

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' '] = s {
        s = rest;
    }
    s
}

/// Parses `TagA || TagB` into TAGS_BUF; returns the encoded list and whether it holds `*`.
fn configure(expr: &[u8]) -> Result<(&'static [u8], bool), Error> {
    // The encoded list is never longer than the expression plus one length prefix: each
    // further prefix replaces a "||".
    let buf = unsafe { &mut *core::ptr::addr_of_mut!(TAGS_BUF) };
    buf.reserve(expr.len() + 2)?;
    let out = buf.slice_mut(expr.len() + 2);
    let (mut at, mut all, mut rest) = (0usize, false, expr);
    loop {
        let cut = rest.windows(2).position(|w| w == b"||");
        let (part, next) = match cut {
            Some(i) => (&rest[..i], Some(&rest[i + 2..])),
            None => (rest, None),
        };
        let tag = trim(part);
        if tag == b"*" {
            all = true;
        } else if !tag.is_empty() {
            out[at..at + 2].copy_from_slice(&(tag.len() as u16).to_le_bytes());
            out[at + 2..at + 2 + tag.len()].copy_from_slice(tag);
            at += 2 + tag.len();
        }
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
    if at == 0 && !all {
        return Err(Error::Params);
    }
    let list = &out[..at];
    Ok((unsafe { core::slice::from_raw_parts(list.as_ptr(), list.len()) }, all))
}

#[no_mangle]
pub extern "C" fn flowd_init(ptr: i32, len: i32) -> i32 {
    let run = || -> Result<(), Error> {
        let params = unsafe { flowd::input(ptr, len)? };
        let expr = flowd::param(params, b"tags")?.ok_or(Error::Params)?;
        let (tags, all) = configure(expr)?;
        unsafe {
            TAGS = tags;
            ALL = all;
            CONFIGURED = true;
        }
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => e.code(),
    }
}

fn listed(tags: &[u8], tag: &[u8]) -> bool {
    let mut rest = tags;
    while rest.len() >= 2 {
        let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        if &rest[2..2 + n] == tag {
            return true;
        }
        rest = &rest[2 + n..];
    }
    false
}

#[no_mangle]
pub extern "C" fn flowd_filter(ptr: i32, len: i32, n: i32) -> i32 {
    // SAFETY: an instance serves one call at a time; the statics change only in flowd_init.
    unsafe {
        if !CONFIGURED {
            return Error::Params.code();
        }
        let (tags, all) = (TAGS, ALL);
        flowd::filter(&mut *core::ptr::addr_of_mut!(BITMAP), ptr, len, n, |rec| Ok(all || (!rec.tags.is_empty() && listed(tags, rec.tags))))
    }
}
