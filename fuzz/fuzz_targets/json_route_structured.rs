//! The routing-field reader on generated request bodies: a structure-aware generator builds JSON
//! documents from routing's own field names and shapes (messages, content parts, token arrays,
//! repeated and null fields, escapes, odd number forms, whitespace), so the fuzzer reaches the
//! deep fields that random bytes seldom do. Checked as in `json_route`.
#![no_main]

use arbitrary::Arbitrary;
use kvgate_fuzz::json::{check_route, endpoint};
use libfuzzer_sys::fuzz_target;
use std::fmt::Write;

const KEYS: [&str; 17] = [
    "model",
    "messages",
    "prompt",
    "input",
    "instructions",
    "tools",
    "stream",
    "cache_salt",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "priority",
    "role",
    "content",
    "type",
    "text",
    "function",
];

#[derive(Arbitrary, Debug)]
enum Key {
    Known(u8),
    /// A known key written with `\u` escapes.
    Escaped(u8),
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Num {
    U(u32),
    I(i64),
    Big,
    NegZero,
    Frac(i32, u16),
    Exp(i16, i16),
}

#[derive(Arbitrary, Debug)]
enum Val {
    Null,
    Bool(bool),
    Num(Num),
    Str(String),
    /// Every char as an escape (`\uXXXX`, surrogate pairs above the BMP, or the short forms).
    EscStr(String),
    /// A lone surrogate escape inside a string.
    Lone(u16),
    Arr(Vec<Val>),
    Obj(Vec<(Key, Val)>),
    /// `{"role": .., "content": ..}`
    Message(Option<String>, Box<Val>),
    /// `{"type": "text", "text": ..}`
    Part(Box<Val>),
}

#[derive(Arbitrary, Debug)]
struct Doc {
    endpoint: u8,
    /// Whitespace style between tokens.
    ws: u8,
    fields: Vec<(Key, Val)>,
}

struct Out {
    s: String,
    ws: u8,
    n: u32,
}

impl Out {
    fn ws(&mut self) {
        self.n = self.n.wrapping_add(1);
        if self.ws == 0 {
            return;
        }
        let pick = (self.n.wrapping_mul(2654435761) >> 28) as u8 & self.ws;
        self.s.push_str(match pick % 5 {
            0 => "",
            1 => " ",
            2 => "\n  ",
            3 => "\t",
            _ => "\r\n",
        });
    }

    fn str_plain(&mut self, t: &str) {
        self.s.push('"');
        for c in t.chars() {
            match c {
                '"' => self.s.push_str("\\\""),
                '\\' => self.s.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.s, "\\u{:04x}", c as u32);
                }
                c => self.s.push(c),
            }
        }
        self.s.push('"');
    }

    fn str_escaped(&mut self, t: &str) {
        self.s.push('"');
        for (i, c) in t.chars().enumerate() {
            match (c, i % 3) {
                ('\n', 0) => self.s.push_str("\\n"),
                ('/', 0) => self.s.push_str("\\/"),
                ('"', 0) => self.s.push_str("\\\""),
                _ => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        let _ = write!(self.s, "\\u{:04X}", u);
                    }
                }
            }
        }
        self.s.push('"');
    }

    fn key(&mut self, k: &Key) {
        match k {
            Key::Known(i) => self.str_plain(KEYS[usize::from(*i) % KEYS.len()]),
            Key::Escaped(i) => self.str_escaped(KEYS[usize::from(*i) % KEYS.len()]),
            Key::Other(s) => self.str_plain(s),
        }
    }

    fn num(&mut self, n: &Num) {
        let _ = match n {
            Num::U(u) => write!(self.s, "{u}"),
            Num::I(i) => write!(self.s, "{i}"),
            Num::Big => write!(self.s, "99999999999999999999"),
            Num::NegZero => write!(self.s, "-0"),
            Num::Frac(a, b) => write!(self.s, "{a}.{b}"),
            Num::Exp(a, e) => write!(self.s, "{a}e{e}"),
        };
    }

    fn val(&mut self, v: &Val, depth: u32) {
        self.ws();
        if depth > 24 {
            self.s.push_str("null");
            return;
        }
        match v {
            Val::Null => self.s.push_str("null"),
            Val::Bool(b) => self.s.push_str(if *b { "true" } else { "false" }),
            Val::Num(n) => self.num(n),
            Val::Str(t) => self.str_plain(t),
            Val::EscStr(t) => self.str_escaped(t),
            Val::Lone(u) => {
                let _ = write!(self.s, "\"a\\u{:04x}b\"", 0xd800 | (u & 0x7ff));
            }
            Val::Arr(items) => {
                self.s.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        self.s.push(',');
                    }
                    self.val(x, depth + 1);
                }
                self.ws();
                self.s.push(']');
            }
            Val::Obj(pairs) => self.obj(pairs.iter().map(|(k, v)| (k, v)), depth),
            Val::Message(role, content) => {
                self.s.push('{');
                if let Some(r) = role {
                    self.str_plain("role");
                    self.s.push(':');
                    self.str_plain(r);
                    self.s.push(',');
                }
                self.str_plain("content");
                self.s.push(':');
                self.val(content, depth + 1);
                self.s.push('}');
            }
            Val::Part(t) => {
                self.s.push_str("{\"type\":\"text\",\"text\":");
                self.val(t, depth + 1);
                self.s.push('}');
            }
        }
        self.ws();
    }

    fn obj<'a>(&mut self, pairs: impl Iterator<Item = (&'a Key, &'a Val)>, depth: u32) {
        self.s.push('{');
        for (i, (k, v)) in pairs.enumerate() {
            if i > 0 {
                self.s.push(',');
            }
            self.ws();
            self.key(k);
            self.ws();
            self.s.push(':');
            self.val(v, depth + 1);
        }
        self.ws();
        self.s.push('}');
    }
}

fuzz_target!(|doc: Doc| {
    let mut out = Out {
        s: String::new(),
        ws: doc.ws,
        n: 0,
    };
    out.obj(doc.fields.iter().map(|(k, v)| (k, v)), 0);
    check_route(endpoint(doc.endpoint), out.s.as_bytes());
});
