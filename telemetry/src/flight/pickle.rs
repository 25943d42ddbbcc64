//! A Python pickle writer for plain data: `None`, booleans, integers, floats, strings, lists,
//! tuples and dicts, in protocol 2 (readable by every Python 3). No memo, no classes: what it
//! writes loads as plain Python values with `pickle.load`, and carries nothing that runs code.

use std::io::{self, Write};

/// A Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Py {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Py>),
    Tuple(Vec<Py>),
    /// Keys and values in insertion order (Python dicts keep it).
    Dict(Vec<(Py, Py)>),
}

impl From<&str> for Py {
    fn from(s: &str) -> Py {
        Py::Str(s.to_owned())
    }
}

impl From<String> for Py {
    fn from(s: String) -> Py {
        Py::Str(s)
    }
}

impl From<bool> for Py {
    fn from(b: bool) -> Py {
        Py::Bool(b)
    }
}

impl From<u64> for Py {
    /// Values past `i64::MAX` saturate (counters and nanosecond times never get there).
    fn from(v: u64) -> Py {
        Py::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl<T: Into<Py>> From<Option<T>> for Py {
    fn from(v: Option<T>) -> Py {
        v.map_or(Py::None, Into::into)
    }
}

/// A dict with string keys, in the given order.
pub fn dict<const N: usize>(items: [(&str, Py); N]) -> Py {
    Py::Dict(items.into_iter().map(|(k, v)| (Py::from(k), v)).collect())
}

// Opcodes (CPython's Lib/pickletools.py documents each).
const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT1: u8 = b'K';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const EMPTY_TUPLE: u8 = b')';
const TUPLE: u8 = b't';
const EMPTY_DICT: u8 = b'}';
const SETITEMS: u8 = b'u';

/// Writes one pickle (protocol 2) to `w`, value by value: [`Pickler::value`] for a whole value,
/// and `begin_*`/`end_*` to stream a dict or list whose items are written one at a time.
pub struct Pickler<W: Write> {
    w: W,
}

impl<W: Write> Pickler<W> {
    /// Starts a pickle.
    pub fn new(mut w: W) -> io::Result<Pickler<W>> {
        w.write_all(&[PROTO, 2])?;
        Ok(Pickler { w })
    }

    /// Ends the pickle (its one top-level value must have been written) and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.w.write_all(&[STOP])?;
        Ok(self.w)
    }

    fn str(&mut self, s: &str) -> io::Result<()> {
        let n = u32::try_from(s.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "string over 4 GiB"))?;
        self.w.write_all(&[BINUNICODE])?;
        self.w.write_all(&n.to_le_bytes())?;
        self.w.write_all(s.as_bytes())
    }

    fn int(&mut self, v: i64) -> io::Result<()> {
        if let Ok(b) = u8::try_from(v) {
            self.w.write_all(&[BININT1, b])
        } else if let Ok(i) = i32::try_from(v) {
            self.w.write_all(&[BININT])?;
            self.w.write_all(&i.to_le_bytes())
        } else {
            // Eight bytes of two's complement, least significant first.
            self.w.write_all(&[LONG1, 8])?;
            self.w.write_all(&v.to_le_bytes())
        }
    }

    /// Writes `v` whole.
    pub fn value(&mut self, v: &Py) -> io::Result<()> {
        match v {
            Py::None => self.w.write_all(&[NONE]),
            Py::Bool(b) => self.w.write_all(&[if *b { NEWTRUE } else { NEWFALSE }]),
            Py::Int(i) => self.int(*i),
            Py::Float(f) => {
                self.w.write_all(&[BINFLOAT])?;
                self.w.write_all(&f.to_be_bytes())
            }
            Py::Str(s) => self.str(s),
            Py::List(items) => {
                self.begin_list()?;
                items.iter().try_for_each(|i| self.value(i))?;
                self.end_list()
            }
            Py::Tuple(items) if items.is_empty() => self.w.write_all(&[EMPTY_TUPLE]),
            Py::Tuple(items) => {
                self.w.write_all(&[MARK])?;
                items.iter().try_for_each(|i| self.value(i))?;
                self.w.write_all(&[TUPLE])
            }
            Py::Dict(items) => {
                self.begin_dict()?;
                for (k, v) in items {
                    self.value(k)?;
                    self.value(v)?;
                }
                self.end_dict()
            }
        }
    }

    /// Opens a dict: then key, value, key, value… ([`Pickler::key`] for string keys), then
    /// [`Pickler::end_dict`].
    pub fn begin_dict(&mut self) -> io::Result<()> {
        self.w.write_all(&[EMPTY_DICT, MARK])
    }

    /// A string key of the open dict.
    pub fn key(&mut self, k: &str) -> io::Result<()> {
        self.str(k)
    }

    pub fn end_dict(&mut self) -> io::Result<()> {
        self.w.write_all(&[SETITEMS])
    }

    /// Opens a list: then its items, then [`Pickler::end_list`].
    pub fn begin_list(&mut self) -> io::Result<()> {
        self.w.write_all(&[EMPTY_LIST, MARK])
    }

    pub fn end_list(&mut self) -> io::Result<()> {
        self.w.write_all(&[APPENDS])
    }
}

/// `v` as one pickle.
pub fn to_bytes(v: &Py) -> Vec<u8> {
    let write = || -> io::Result<Vec<u8>> {
        let mut p = Pickler::new(Vec::new())?;
        p.value(v)?;
        p.finish()
    };
    // Writing into a Vec fails only for a string over 4 GiB.
    write().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each byte string is what CPython's `pickle.loads` reads back as the value named
    /// (checked with `pickletools.dis`).
    #[test]
    fn opcodes_of_each_kind_of_value() {
        assert_eq!(to_bytes(&Py::None), b"\x80\x02N.");
        assert_eq!(to_bytes(&Py::Bool(true)), b"\x80\x02\x88.");
        assert_eq!(to_bytes(&Py::Bool(false)), b"\x80\x02\x89.");
        assert_eq!(to_bytes(&Py::Int(7)), b"\x80\x02K\x07.");
        assert_eq!(to_bytes(&Py::Int(-1)), b"\x80\x02J\xff\xff\xff\xff.");
        assert_eq!(to_bytes(&Py::Int(70_000)), b"\x80\x02J\x70\x11\x01\x00.");
        assert_eq!(to_bytes(&Py::Int(1 << 40)), b"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00.");
        assert_eq!(to_bytes(&Py::Int(i64::MIN)), b"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.");
        assert_eq!(to_bytes(&Py::Float(1.5)), b"\x80\x02G\x3f\xf8\x00\x00\x00\x00\x00\x00.");
        assert_eq!(to_bytes(&Py::from("é")), b"\x80\x02X\x02\x00\x00\x00\xc3\xa9.");
        assert_eq!(to_bytes(&Py::Tuple(vec![])), b"\x80\x02).");
        assert_eq!(to_bytes(&Py::Tuple(vec![Py::from("a"), Py::Int(1)])), b"\x80\x02(X\x01\x00\x00\x00aK\x01t.");
        assert_eq!(to_bytes(&Py::List(vec![])), b"\x80\x02](e.");
        assert_eq!(to_bytes(&Py::List(vec![Py::Int(1), Py::None])), b"\x80\x02](K\x01Ne.");
        assert_eq!(to_bytes(&dict([("k", Py::List(vec![]))])), b"\x80\x02}(X\x01\x00\x00\x00k](eu.");
        assert_eq!(Py::from(u64::MAX), Py::Int(i64::MAX));
        assert_eq!(Py::from(None::<u64>), Py::None);
    }

    #[test]
    fn streamed_containers_match_whole_values() {
        let whole = dict([("a", Py::List(vec![Py::Int(1), Py::Int(2)])), ("b", Py::None)]);
        let mut p = Pickler::new(Vec::new()).unwrap();
        p.begin_dict().unwrap();
        p.key("a").unwrap();
        p.begin_list().unwrap();
        p.value(&Py::Int(1)).unwrap();
        p.value(&Py::Int(2)).unwrap();
        p.end_list().unwrap();
        p.key("b").unwrap();
        p.value(&Py::None).unwrap();
        p.end_dict().unwrap();
        assert_eq!(p.finish().unwrap(), to_bytes(&whole));
    }
}
