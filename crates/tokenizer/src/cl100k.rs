//! The built-in `cl100k_base` encoder: a hand-written pre-tokenizer, whole-token lookup, and the
//! `bpe` crate's byte-pair encoder (through `bpe-openai`'s prebuilt vocabulary).
//!
//! It gives exactly the ids of `tiktoken-rs` 0.12's `CoreBPE::encode_with_special_tokens` (and of
//! `encode_ordinary` on text without special tokens), without its backtracking regex.
//!
//! # The pre-tokenizer
//!
//! [`Cl100k::pieces`] cuts text where `tiktoken-rs`'s cl100k pattern ([`TIKTOKEN_PATTERN`]) run
//! with `find_iter` cuts it. Every character starts a match of some alternative, so the pieces
//! tile the text; at each position the first alternative that matches wins:
//!
//! 1. `'(?i:[sdmt]|ll|ve|re)`: an apostrophe and a contraction, case-insensitively (`ſ` folds
//!    to `s`);
//! 2. `[^\r\n\p{L}\p{N}]?+\p{L}++`: a run of letters, with one character before it that is
//!    neither a letter, a number, `\r` nor `\n`;
//! 3. `\p{N}{1,3}+`: one to three numbers;
//! 4. ` ?[^\s\p{L}\p{N}]++[\r\n]*+`: an optional space, a run of characters that are neither
//!    whitespace, letters nor numbers, then any `\r` / `\n`;
//! 5. `\s++$`: whitespace up to the end of the text;
//! 6. `\s*[\r\n]`: whitespace up to and including its last `\r` / `\n`;
//! 7. `\s+(?!\S)`: whitespace but its last character, when something else follows;
//! 8. `\s`: one whitespace character.
//!
//! `\p{L}`, `\p{N}` and `\s` (Unicode `White_Space`) are taken from `regex-syntax`, the tables
//! `fancy-regex` matches with. The tests compare the pieces with `fancy-regex` running the same
//! pattern and the ids with `tiktoken-rs` (see docs/tokenizer.md).
//!
//! # Special tokens
//!
//! kvgate encodes every cl100k special token found in the text as its id (as
//! `encode_with_special_tokens` does): the text is cut at the leftmost matches of
//! [`SPECIAL_TOKENS`] and the pieces between them are encoded as ordinary text. The built-in
//! chat template's markers (`<|system|>`, `<|end|>`, ...) are not special tokens of cl100k: they
//! are ordinary text.
//!
//! # Byte-pair encoding
//!
//! A piece that is a token of the vocabulary is that token (tiktoken's shortcut too); any other
//! piece goes through `bpe`'s backtracking encoder, which gives the ids of tiktoken's merge
//! loop (lowest rank first) for this vocabulary.

use std::collections::HashMap;
use std::sync::OnceLock;

use bpe_openai::byte_pair_encoding::BytePairEncoding;

use crate::TokenizerError;

/// The cl100k pre-tokenization pattern of `tiktoken-rs` 0.12 (`cl100k_base()`), which
/// [`Cl100k::pieces`] reproduces.
pub const TIKTOKEN_PATTERN: &str = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";

/// cl100k's special tokens and their ids.
pub const SPECIAL_TOKENS: [(&str, u32); 5] = [
    ("<|endoftext|>", 100257),
    ("<|fim_prefix|>", 100258),
    ("<|fim_middle|>", 100259),
    ("<|fim_suffix|>", 100260),
    ("<|endofprompt|>", 100276),
];

/// Character class bits.
const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 4;
/// `\r` or `\n` (also `SPACE`).
const NEWLINE: u8 = 8;

/// The encoder. One per process ([`Cl100k::get`]), shared by every built-in [`crate::Tokenizer`].
pub struct Cl100k {
    bpe: &'static BytePairEncoding,
    /// Every token's bytes → its id, for pieces that are one token.
    whole: HashMap<&'static [u8], u32, ahash::RandomState>,
    /// Class bits of every character below U+10000.
    bmp: Box<[u8]>,
    /// Class bits of the characters above: sorted, disjoint, inclusive ranges.
    astral: Vec<(u32, u32, u8)>,
    specials: aho_corasick::AhoCorasick,
}

static CL100K: OnceLock<Result<Cl100k, String>> = OnceLock::new();

impl Cl100k {
    /// The process-wide encoder, built on first use (tens of milliseconds).
    pub fn get() -> Result<&'static Self, TokenizerError> {
        CL100K
            .get_or_init(Self::build)
            .as_ref()
            .map_err(|e| TokenizerError::Load(e.clone()))
    }

    fn build() -> Result<Self, String> {
        let bpe = &bpe_openai::cl100k_base().bpe;
        let n = u32::try_from(bpe.num_tokens()).map_err(|e| e.to_string())?;
        let mut whole = HashMap::with_capacity_and_hasher(n as usize, ahash::RandomState::new());
        for id in 0..n {
            whole.insert(bpe.token_bytes(id), id);
        }
        let mut bmp = vec![0u8; 0x1_0000].into_boxed_slice();
        let mut astral = Vec::new();
        for (pattern, bits) in [
            (r"\p{L}", LETTER),
            (r"\p{N}", NUMBER),
            (r"\s", SPACE),
            (r"[\r\n]", NEWLINE | SPACE),
        ] {
            for (lo, hi) in class_ranges(pattern)? {
                for c in lo..=hi.min(0xFFFF) {
                    bmp[c as usize] |= bits;
                }
                if hi > 0xFFFF {
                    astral.push((lo.max(0x1_0000), hi, bits));
                }
            }
        }
        // No character is in two of L, N and \s, so the astral ranges are disjoint.
        astral.sort_unstable();
        let specials = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostFirst)
            .build(SPECIAL_TOKENS.map(|(s, _)| s))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            bpe,
            whole,
            bmp,
            astral,
            specials,
        })
    }

    /// Ids of `text`, special tokens encoded as their ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        self.each_segment(text, |seg| match seg {
            Segment::Text(t) => self.encode_ordinary_into(t, &mut out),
            Segment::Special(id) => out.push(id),
        });
        out
    }

    /// Number of ids [`Cl100k::encode`] gives for `text`.
    pub fn count(&self, text: &str) -> usize {
        let mut n = 0;
        self.each_segment(text, |seg| match seg {
            Segment::Text(t) => {
                for piece in self.pieces(t) {
                    n += match self.whole.get(piece.as_bytes()) {
                        Some(_) => 1,
                        None => self.bpe.count(piece.as_bytes()),
                    };
                }
            }
            Segment::Special(_) => n += 1,
        });
        n
    }

    /// Ids of `text` with no special-token handling (tiktoken's `encode_ordinary`).
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        self.encode_ordinary_into(text, &mut out);
        out
    }

    fn encode_ordinary_into(&self, text: &str, out: &mut Vec<u32>) {
        for piece in self.pieces(text) {
            match self.whole.get(piece.as_bytes()) {
                Some(&id) => out.push(id),
                None => out.extend(self.bpe.encode_via_backtracking(piece.as_bytes())),
            }
        }
    }

    /// Calls `f` on the text between special tokens and on each special token, in order.
    fn each_segment(&self, text: &str, mut f: impl FnMut(Segment<'_>)) {
        // The common case: no special token can be in the text.
        if memchr::memmem::find(text.as_bytes(), b"<|").is_none() {
            f(Segment::Text(text));
            return;
        }
        let mut start = 0;
        for m in self.specials.find_iter(text) {
            if m.start() > start {
                f(Segment::Text(&text[start..m.start()]));
            }
            f(Segment::Special(SPECIAL_TOKENS[m.pattern().as_usize()].1));
            start = m.end();
        }
        if start < text.len() {
            f(Segment::Text(&text[start..]));
        }
    }

    /// The bytes of a token id (special tokens included), `None` for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        if (id as usize) < self.bpe.num_tokens() {
            return Some(self.bpe.token_bytes(id));
        }
        SPECIAL_TOKENS
            .iter()
            .find(|(_, sid)| *sid == id)
            .map(|(s, _)| s.as_bytes())
    }

    /// The pre-tokenizer's pieces of `text` (see the module docs), in order; they concatenate to
    /// `text`.
    pub fn pieces<'t>(&'t self, text: &'t str) -> Pieces<'t> {
        Pieces {
            cl: self,
            text,
            pos: 0,
        }
    }

    /// Class bits and UTF-8 length of the character at byte `i` (`(0, 0)` at the end).
    #[inline(always)]
    fn at(&self, b: &[u8], i: usize) -> (u8, usize) {
        let Some(&b0) = b.get(i) else {
            return (0, 0);
        };
        if b0 < 0x80 {
            return (self.bmp[b0 as usize], 1);
        }
        let (c, len) = decode_utf8(b, i);
        let bits = if c < 0x1_0000 {
            self.bmp[c as usize]
        } else {
            match self.astral.binary_search_by(|&(lo, hi, _)| {
                if hi < c {
                    std::cmp::Ordering::Less
                } else if lo > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            }) {
                Ok(k) => self.astral[k].2,
                Err(_) => 0,
            }
        };
        (bits, len)
    }

    /// End of the run of characters from `i` whose bits satisfy `keep`.
    #[inline(always)]
    fn run_end(&self, b: &[u8], mut i: usize, keep: impl Fn(u8) -> bool) -> usize {
        loop {
            let (bits, len) = self.at(b, i);
            if len == 0 || !keep(bits) {
                return i;
            }
            i += len;
        }
    }

    /// End of the piece that starts at byte `i` (`i < b.len()`, on a character boundary).
    fn piece_end(&self, b: &[u8], i: usize) -> usize {
        let (bits, len) = self.at(b, i);
        // 1. '(?i:[sdmt]|ll|ve|re)
        if b[i] == b'\'' {
            if let Some(end) = contraction_end(b, i + 1) {
                return end;
            }
        }
        // 2. [^\r\n\p{L}\p{N}]?+\p{L}++
        let is_letter = |x: u8| x & LETTER != 0;
        if is_letter(bits) {
            return self.run_end(b, i + len, is_letter);
        }
        if bits & (NUMBER | NEWLINE) == 0 && is_letter(self.at(b, i + len).0) {
            return self.run_end(b, i + len, is_letter);
        }
        // 3. \p{N}{1,3}+
        if bits & NUMBER != 0 {
            let mut end = i + len;
            for _ in 0..2 {
                let (next, l) = self.at(b, end);
                if l == 0 || next & NUMBER == 0 {
                    break;
                }
                end += l;
            }
            return end;
        }
        // 4.  ?[^\s\p{L}\p{N}]++[\r\n]*+
        let is_other = |x: u8| x & (LETTER | NUMBER | SPACE) == 0;
        let mut j = i;
        if b[i] == b' ' && is_other(self.at(b, i + 1).0) && i + 1 < b.len() {
            j = i + 1;
        }
        if is_other(self.at(b, j).0) {
            let end = self.run_end(b, j, is_other);
            return self.run_end(b, end, |x| x & NEWLINE != 0);
        }
        // Only whitespace is left: `bits` has SPACE.
        let run_end = self.run_end(b, i, |x| x & SPACE != 0);
        // 5. \s++$
        if run_end == b.len() {
            return run_end;
        }
        // 6. \s*[\r\n] (`\r` and `\n` are single bytes; no other byte of a character equals them)
        if let Some(k) = b[i..run_end]
            .iter()
            .rposition(|&x| x == b'\r' || x == b'\n')
        {
            return i + k + 1;
        }
        // 7. \s+(?!\S): all but the run's last character, when the run has two or more.
        if run_end > i + len {
            let mut last = run_end - 1;
            while b[last] & 0xC0 == 0x80 {
                last -= 1;
            }
            return last;
        }
        // 8. \s
        i + len
    }
}

enum Segment<'t> {
    Text(&'t str),
    Special(u32),
}

/// Iterator over [`Cl100k::pieces`].
pub struct Pieces<'t> {
    cl: &'t Cl100k,
    text: &'t str,
    pos: usize,
}

impl<'t> Iterator for Pieces<'t> {
    type Item = &'t str;

    #[inline]
    fn next(&mut self) -> Option<&'t str> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        let end = self.cl.piece_end(self.text.as_bytes(), start);
        self.pos = end;
        // Piece ends are character boundaries; `get` keeps that unchecked claim from panicking.
        self.text.get(start..end)
    }
}

/// End of an apostrophe contraction whose letters start at `i`, matched case-insensitively as
/// `regex-syntax` folds case (`s` also matches `ſ`, U+017F).
fn contraction_end(b: &[u8], i: usize) -> Option<usize> {
    let lower = |k: usize| b.get(k).map(u8::to_ascii_lowercase);
    match lower(i)? {
        b's' | b'd' | b'm' | b't' => Some(i + 1),
        b'l' if lower(i + 1) == Some(b'l') => Some(i + 2),
        b'v' | b'r' if lower(i + 1) == Some(b'e') => Some(i + 2),
        // ſ
        0xC5 if b.get(i + 1) == Some(&0xBF) => Some(i + 2),
        _ => None,
    }
}

/// The code point and length of the (valid) UTF-8 sequence starting at `b[i]`, a lead byte of
/// two to four bytes.
#[inline(always)]
fn decode_utf8(b: &[u8], i: usize) -> (u32, usize) {
    let cont = |k: usize| u32::from(b.get(i + k).copied().unwrap_or(0x80) & 0x3F);
    let b0 = u32::from(b[i]);
    if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | cont(1), 2)
    } else if b0 < 0xF0 {
        (((b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2), 3)
    } else {
        (
            ((b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3),
            4,
        )
    }
}

/// The inclusive code-point ranges of a one-class pattern, as `regex-syntax` reads it.
fn class_ranges(pattern: &str) -> Result<Vec<(u32, u32)>, String> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::parse(pattern).map_err(|e| e.to_string())?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(cls)) => Ok(cls
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect()),
        _ => Err(format!("{pattern} is not a Unicode class")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cl() -> &'static Cl100k {
        Cl100k::get().unwrap()
    }

    fn reference() -> &'static tiktoken_rs::CoreBPE {
        tiktoken_rs::cl100k_base_singleton()
    }

    /// `fancy-regex` running tiktoken-rs's pattern: the pieces tiktoken encodes.
    fn reference_pieces(text: &str) -> Vec<&str> {
        static RE: OnceLock<fancy_regex::Regex> = OnceLock::new();
        RE.get_or_init(|| fancy_regex::Regex::new(TIKTOKEN_PATTERN).unwrap())
            .find_iter(text)
            .map(|m| m.unwrap().as_str())
            .collect()
    }

    #[track_caller]
    fn check(text: &str) {
        let cl = cl();
        let pieces: Vec<&str> = cl.pieces(text).collect();
        assert_eq!(pieces, reference_pieces(text), "pieces of {text:?}");
        let ids = cl.encode(text);
        assert_eq!(
            ids,
            reference().encode_with_special_tokens(text),
            "ids of {text:?}"
        );
        assert_eq!(cl.count(text), ids.len(), "count of {text:?}");
        if !SPECIAL_TOKENS.iter().any(|(s, _)| text.contains(s)) {
            assert_eq!(cl.encode_ordinary(text), ids, "{text:?}");
        }
    }

    #[test]
    fn tricky_strings_match_tiktoken() {
        let cases = [
            "",
            "hello world",
            // Contractions, mixed case, the long s (which folds to s), non-contractions.
            "I'm, you're, he's, we've, they'll, she'd, it't",
            "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D 'Ll 'lL 'Ve 'rE 'ſ 'ſun",
            "'sun 'dog 'x ' s '' 's's 'll'll '\n's don't",
            // Letters of many scripts, marks, numbers that are not digits.
            "naïve café ünïcode Ελληνικά русский 中文字符 日本語のテキスト 한국어 العربية עברית",
            "e\u{301}a\u{308}\u{301} \u{301}x \u{20dd}\u{20dd}",
            "Ⅻ ⅫⅫⅫⅫ ½¾⅓ ٣٤٥٦ १२३४ 𝟙𝟚𝟛𝟜 ①②③④",
            "1 12 123 1234 12345 123456789012345678901234567890 3.14159 1,000,000 0x1F",
            // Whitespace runs before non-space, at the end, with \r\n runs and Unicode spaces.
            "a  b   c    d\t\te \t f",
            "a \n b\n\n c \r\n\r\n d\r\r\n\n  e",
            "trailing spaces   ",
            "trailing newline and space\n ",
            "trailing mix \n \t\n  \u{a0}",
            "\u{a0}x \u{a0}\u{a0}y \u{3000}z \u{2028}w \u{85}v \u{b}\u{c}u \u{200a}\u{200a}t",
            "   ",
            "\n",
            "\r\n\r\n",
            " \n \n ",
            // Punctuation runs with newlines, spaces before punctuation.
            "fn main() { println!(\"x\"); }\n\n    let x = a->b; // ok?!\r\n",
            " ... !!! ??? ;;;\n\n\n---\r\n",
            // Emoji, ZWJ sequences, flags, symbols.
            "🚀 🚀🚀 👨‍👩‍👧‍👦 🇫🇷🇩🇪 ❤️ ✓ → ∑ ©",
            // Valid UTF-8 that looks odd: controls, noncharacters, private use, the last scalar.
            "\u{0}\u{1}\u{7f}\u{80}\u{9f} \u{fffe}\u{ffff} \u{e000}\u{f8ff} \u{10ffff}\u{10fffd}",
            "\u{feff}bom \u{200b}zero\u{200d}width \u{2060}",
            // Special tokens and template markers (plain text to cl100k).
            "<|endoftext|>",
            "a<|endoftext|>b<|fim_prefix|><|fim_middle|><|fim_suffix|>c<|endofprompt|>",
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n",
            "<|endoftext|\n<|endof<|endoftext|>text|> <|<|endofprompt|>|>",
            "x \n<|endoftext|> \n",
        ];
        for case in cases {
            check(case);
        }
        // Long runs.
        check(&"9".repeat(1000));
        check(&"a".repeat(5000));
        check(&" ".repeat(3000));
        check(&"\n".repeat(300));
        check(&"é".repeat(777));
        check(&"!?".repeat(900));
        check(&"abc ".repeat(2000));
    }

    #[test]
    fn vocabulary_and_special_ids_match_tiktoken() {
        let cl = cl();
        assert_eq!(cl.bpe.num_tokens(), 100_256);
        for id in 0..100_300u32 {
            let ours = cl.token_bytes(id);
            let theirs = reference().decode_bytes(&[id]).ok();
            assert_eq!(ours, theirs.as_deref(), "id {id}");
        }
        assert_eq!(cl.token_bytes(u32::MAX), None);
        for (s, id) in SPECIAL_TOKENS {
            assert_eq!(reference().encode_with_special_tokens(s), vec![id]);
            assert!(reference().special_tokens().contains(s));
        }
        assert_eq!(reference().special_tokens().len(), SPECIAL_TOKENS.len());
    }

    /// Every Unicode scalar value is classified as `fancy-regex` classifies it, and folds into
    /// a contraction exactly when `fancy-regex`'s `(?i:...)` says so.
    #[test]
    fn character_classes_match_fancy_regex_for_every_char() {
        let cl = cl();
        let re = |p: &str| fancy_regex::Regex::new(p).unwrap();
        let (letter, number, space) = (re(r"^\p{L}$"), re(r"^\p{N}$"), re(r"^\s$"));
        let fold = [
            (re(r"^(?i:[sdmt])$"), "'{}", 1),
            (re(r"^(?i:l)$"), "'l{}", 2),
            (re(r"^(?i:l)$"), "'{}l", 2),
            (re(r"^(?i:e)$"), "'v{}", 2),
            (re(r"^(?i:e)$"), "'r{}", 2),
            (re(r"^(?i:[vr])$"), "'{}e", 2),
        ];
        let mut buf = [0u8; 4];
        for c in (0..=0x10_FFFFu32).filter_map(char::from_u32) {
            let s = c.encode_utf8(&mut buf);
            let bits = cl.at(s.as_bytes(), 0).0;
            let expect = [
                (letter.is_match(s).unwrap(), LETTER),
                (number.is_match(s).unwrap(), NUMBER),
                (space.is_match(s).unwrap(), SPACE),
                (c == '\r' || c == '\n', NEWLINE),
            ]
            .iter()
            .fold(0, |acc, &(m, bit)| if m { acc | bit } else { acc });
            assert_eq!(bits, expect, "{c:?} U+{:04X}", c as u32);
            for (re, probe, chars) in &fold {
                let text = probe.replace("{}", s);
                let ours = contraction_end(text.as_bytes(), 1) == Some(text.len());
                assert_eq!(ours, re.is_match(s).unwrap(), "{text:?} {chars}");
            }
        }
    }
}
