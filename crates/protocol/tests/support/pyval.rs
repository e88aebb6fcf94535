//! Reads the gunicorn test-request `.py` files as data, without running Python.
//!
//! They use a handful of forms: imports (skipped), `name = <expression>`, `cfg.set(...)`
//! calls, and expressions made of string, bytes and integer literals (any quoting, with
//! escapes), tuples, lists, dicts, names bound earlier, the calls `uri(x)` and `Config()`,
//! and the methods `replace`, `decode` and `encode`. Anything else is an error naming what
//! was found, so a new form in the corpus shows up as a clear failure, not a wrong reading.

use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Bytes(Vec<u8>),
    Int(i64),
    Bool(bool),
    None,
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    /// A name bound outside the file (an exception class, say).
    Name(String),
    /// `object.method(args)` on a name from outside the file, such as `cfg.set(...)`.
    Call(String, Vec<Value>),
}

impl Value {
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().find(|(k, _)| *k == Value::Str(key.into())).map(|(_, v)| v),
            _ => None,
        }
    }

    /// A string or bytes value as bytes; a `str` is taken as Latin-1, as WSGI does.
    pub fn as_bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Value::Bytes(b) => Ok(b.clone()),
            Value::Str(s) => {
                s.chars().map(|c| u8::try_from(u32::from(c)).map_err(|_| format!("{c:?} is not Latin-1"))).collect()
            }
            other => Err(format!("expected a string, found {other:?}")),
        }
    }
}

pub struct Module {
    pub vars: HashMap<String, Value>,
    /// `object.method(args)` statements, in order.
    pub calls: Vec<(String, Vec<Value>)>,
}

pub fn parse_module(source: &str) -> Result<Module, String> {
    let tokens = tokenize(source)?;
    let mut parser = Parser { tokens, pos: 0, vars: HashMap::new() };
    let mut calls = Vec::new();
    while !parser.at_end() {
        if parser.eat(&Token::Newline) {
            continue;
        }
        if matches!(parser.peek(), Some(Token::Name(n)) if n == "from" || n == "import") {
            while !parser.at_end() && !parser.eat(&Token::Newline) {
                parser.pos += 1;
            }
            continue;
        }
        if let (Some(Token::Name(name)), Some(Token::Punct('='))) = (parser.peek(), parser.tokens.get(parser.pos + 1)) {
            let name = name.clone();
            parser.pos += 2;
            let value = parser.expression()?;
            parser.vars.insert(name, value);
        } else {
            match parser.expression()? {
                Value::Call(target, args) => calls.push((target, args)),
                other => return Err(format!("unexpected statement {other:?}")),
            }
        }
        if !parser.at_end() && !parser.eat(&Token::Newline) {
            return Err(format!("expected the end of a statement, found {:?}", parser.peek()));
        }
    }
    Ok(Module { vars: parser.vars, calls })
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    Int(i64),
    Str(Value),
    Punct(char),
    Newline,
}

fn tokenize(source: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\r' => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\\' if chars.get(i + 1) == Some(&'\n') => i += 2,
            '\n' => {
                if depth == 0 && tokens.last().is_some_and(|t| *t != Token::Newline) {
                    tokens.push(Token::Newline);
                }
                i += 1;
            }
            '(' | '[' | '{' => {
                depth += 1;
                tokens.push(Token::Punct(c));
                i += 1;
            }
            ')' | ']' | '}' => {
                depth = depth.checked_sub(1).ok_or("unbalanced brackets")?;
                tokens.push(Token::Punct(c));
                i += 1;
            }
            ',' | ':' | '.' | '=' | '-' => {
                tokens.push(Token::Punct(c));
                i += 1;
            }
            _ if c.is_ascii_digit() => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '_') {
                    i += 1;
                }
                let text: String = chars[start..i].iter().filter(|&&c| c != '_').collect();
                tokens.push(Token::Int(text.parse().map_err(|e| format!("bad integer {text}: {e}"))?));
            }
            _ if c.is_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let prefix = word.to_ascii_lowercase();
                let is_prefix = matches!(prefix.as_str(), "b" | "r" | "u" | "br" | "rb");
                if is_prefix && matches!(chars.get(i), Some('"' | '\'')) {
                    let (value, next) = string_literal(&chars, i, prefix.contains('b'), prefix.contains('r'))?;
                    tokens.push(Token::Str(value));
                    i = next;
                } else {
                    tokens.push(Token::Name(word));
                }
            }
            '"' | '\'' => {
                let (value, next) = string_literal(&chars, i, false, false)?;
                tokens.push(Token::Str(value));
                i = next;
            }
            _ => return Err(format!("unexpected character {c:?}")),
        }
    }
    Ok(tokens)
}

/// A string literal starting at the quote `chars[start]`; returns it and where it ends.
fn string_literal(chars: &[char], start: usize, bytes: bool, raw: bool) -> Result<(Value, usize), String> {
    let quote = chars[start];
    let triple = chars.get(start + 1) == Some(&quote) && chars.get(start + 2) == Some(&quote);
    let mut i = start + if triple { 3 } else { 1 };
    let mut text: Vec<char> = Vec::new();
    loop {
        let c = *chars.get(i).ok_or("unterminated string")?;
        if c == quote {
            if !triple {
                i += 1;
                break;
            }
            if chars.get(i + 1) == Some(&quote) && chars.get(i + 2) == Some(&quote) {
                i += 3;
                break;
            }
        }
        if c == '\n' && !triple {
            return Err("newline in a single-quoted string".into());
        }
        if c == '\\' && !raw {
            let (unescaped, next) = escape(chars, i, bytes)?;
            text.extend(unescaped);
            i = next;
            continue;
        }
        text.push(c);
        i += 1;
    }
    let value = if bytes {
        Value::Bytes(
            text.iter()
                .map(|&c| u8::try_from(u32::from(c)).map_err(|_| format!("{c:?} in a bytes literal")))
                .collect::<Result<_, _>>()?,
        )
    } else {
        Value::Str(text.into_iter().collect())
    };
    Ok((value, i))
}

/// The escape sequence at `chars[at]` (a backslash): what it stands for and where it ends.
/// In bytes literals, `\x` stands for a byte (kept as the char of that code point).
fn escape(chars: &[char], at: usize, bytes: bool) -> Result<(Vec<char>, usize), String> {
    let next = *chars.get(at + 1).ok_or("backslash at the end")?;
    let hex = |from: usize, len: usize| -> Result<char, String> {
        let digits: String = chars.get(from..from + len).ok_or("short escape")?.iter().collect();
        let code = u32::from_str_radix(&digits, 16).map_err(|e| format!("bad escape {digits}: {e}"))?;
        char::from_u32(code).ok_or_else(|| format!("bad code point {code:x}"))
    };
    Ok(match next {
        '\n' => (vec![], at + 2),
        '\\' | '\'' | '"' => (vec![next], at + 2),
        'n' => (vec!['\n'], at + 2),
        'r' => (vec!['\r'], at + 2),
        't' => (vec!['\t'], at + 2),
        'a' => (vec!['\x07'], at + 2),
        'b' => (vec!['\x08'], at + 2),
        'f' => (vec!['\x0c'], at + 2),
        'v' => (vec!['\x0b'], at + 2),
        'x' => (vec![hex(at + 2, 2)?], at + 4),
        'u' if !bytes => (vec![hex(at + 2, 4)?], at + 6),
        'U' if !bytes => (vec![hex(at + 2, 8)?], at + 10),
        '0'..='7' => {
            let mut end = at + 1;
            while end < at + 4 && chars.get(end).is_some_and(|c| ('0'..='7').contains(c)) {
                end += 1;
            }
            let digits: String = chars[at + 1..end].iter().collect();
            let code = u32::from_str_radix(&digits, 8).map_err(|e| e.to_string())?;
            (vec![char::from_u32(code).ok_or("bad octal escape")?], end)
        }
        // Python keeps unknown escapes as they are.
        _ => (vec!['\\'], at + 1),
    })
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    vars: HashMap<String, Value>,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.tokens.len()
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn eat(&mut self, token: &Token) -> bool {
        if self.peek() == Some(token) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(&Token::Punct(c)) {
            Ok(())
        } else {
            Err(format!("expected {c:?}, found {:?}", self.peek()))
        }
    }

    fn expression(&mut self) -> Result<Value, String> {
        let mut value = self.primary()?;
        loop {
            if self.eat(&Token::Punct('(')) {
                let args = self.items(')')?;
                value = call(value, args)?;
            } else if self.eat(&Token::Punct('.')) {
                let Some(Token::Name(method)) = self.peek().cloned() else {
                    return Err(format!("expected a method name, found {:?}", self.peek()));
                };
                self.pos += 1;
                self.expect('(')?;
                let args = self.items(')')?;
                value = method_call(value, &method, args)?;
            } else {
                return Ok(value);
            }
        }
    }

    /// Comma-separated expressions up to `close` (consumed), trailing comma allowed.
    fn items(&mut self, close: char) -> Result<Vec<Value>, String> {
        let mut items = Vec::new();
        while !self.eat(&Token::Punct(close)) {
            items.push(self.expression()?);
            if !self.eat(&Token::Punct(',')) {
                self.expect(close)?;
                break;
            }
        }
        Ok(items)
    }

    fn primary(&mut self) -> Result<Value, String> {
        let token = self.peek().cloned().ok_or("unexpected end of file")?;
        self.pos += 1;
        Ok(match token {
            Token::Str(first) => {
                // Adjacent literals concatenate.
                let mut value = first;
                while let Some(Token::Str(next)) = self.peek().cloned() {
                    self.pos += 1;
                    value = match (value, next) {
                        (Value::Str(a), Value::Str(b)) => Value::Str(a + &b),
                        (Value::Bytes(mut a), Value::Bytes(b)) => {
                            a.extend(b);
                            Value::Bytes(a)
                        }
                        _ => return Err("str and bytes literals side by side".into()),
                    };
                }
                value
            }
            Token::Int(n) => Value::Int(n),
            Token::Punct('-') => match self.primary()? {
                Value::Int(n) => Value::Int(-n),
                other => return Err(format!("cannot negate {other:?}")),
            },
            Token::Name(name) => match name.as_str() {
                "True" => Value::Bool(true),
                "False" => Value::Bool(false),
                "None" => Value::None,
                _ => self.vars.get(&name).cloned().unwrap_or(Value::Name(name)),
            },
            Token::Punct('(') => {
                let mut items = self.items(')')?;
                if items.len() == 1 {
                    items.pop().expect("one item")
                } else {
                    Value::Tuple(items)
                }
            }
            Token::Punct('[') => Value::List(self.items(']')?),
            Token::Punct('{') => {
                let mut entries = Vec::new();
                while !self.eat(&Token::Punct('}')) {
                    let key = self.expression()?;
                    self.expect(':')?;
                    let value = self.expression()?;
                    entries.push((key, value));
                    if !self.eat(&Token::Punct(',')) {
                        self.expect('}')?;
                        break;
                    }
                }
                Value::Dict(entries)
            }
            other => return Err(format!("unexpected {other:?}")),
        })
    }
}

fn call(callee: Value, mut args: Vec<Value>) -> Result<Value, String> {
    match callee {
        // The harness's uri() parses a target; the raw target is what is compared here.
        Value::Name(name) if name == "uri" && args.len() == 1 => Ok(args.pop().expect("one argument")),
        Value::Name(name) if name == "Config" && args.is_empty() => Ok(Value::Name("Config()".into())),
        other => Err(format!("unsupported call of {other:?}")),
    }
}

fn method_call(receiver: Value, method: &str, args: Vec<Value>) -> Result<Value, String> {
    match (receiver, method, args.as_slice()) {
        (Value::Name(object), _, _) => Ok(Value::Call(format!("{object}.{method}"), args)),
        (Value::Str(s), "replace", [Value::Str(from), Value::Str(to)]) => Ok(Value::Str(s.replace(from, to))),
        (Value::Bytes(b), "replace", [Value::Bytes(from), Value::Bytes(to)]) => Ok(Value::Bytes(replace(&b, from, to))),
        (Value::Bytes(b), "decode", [Value::Str(encoding)]) if encoding == "utf-8" => {
            String::from_utf8(b).map(Value::Str).map_err(|e| e.to_string())
        }
        (Value::Str(s), "encode", [Value::Str(encoding)]) if encoding == "utf-8" => Ok(Value::Bytes(s.into_bytes())),
        (receiver, method, args) => Err(format!("unsupported method {method}{args:?} on {receiver:?}")),
    }
}

fn replace(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if !from.is_empty() && haystack[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_forms_in_use() {
        let source = r#"
# comment
from gunicorn.config import Config
cfg = Config()
cfg.set('limit_request_line', 8200)
cert = """a
 b""".replace("\n", "")
req1 = {
    "method": "GET",
    "uri": uri('/with_"quotes"'),
    "version": (1, 1),
    "headers": [("X", "caf\u00c3\u00a9"), ('Y', cert)],
    "body": b"a\r\n" b'\x00\\',
}
request = [req1, req1]
other = b"""x
y""".decode('utf-8').replace('\n', '\r\n').encode('utf-8')
"#;
        let module = parse_module(source).unwrap();
        assert_eq!(
            module.calls,
            vec![("Config().set".to_string(), vec![Value::Str("limit_request_line".into()), Value::Int(8200)])]
        );
        let request = &module.vars["request"];
        let Value::List(items) = request else { panic!("{request:?}") };
        assert_eq!(items.len(), 2);
        let req = &items[0];
        assert_eq!(req.get("uri"), Some(&Value::Str("/with_\"quotes\"".into())));
        assert_eq!(req.get("version"), Some(&Value::Tuple(vec![Value::Int(1), Value::Int(1)])));
        assert_eq!(req.get("body"), Some(&Value::Bytes(b"a\r\n\x00\\".to_vec())));
        let Some(Value::List(headers)) = req.get("headers") else { panic!() };
        assert_eq!(headers[0], Value::Tuple(vec![Value::Str("X".into()), Value::Str("caf\u{c3}\u{a9}".into())]));
        assert_eq!(
            headers[0].clone(),
            Value::Tuple(vec![Value::Str("X".into()), Value::Str("caf\u{c3}\u{a9}".into())])
        );
        assert_eq!(headers[1], Value::Tuple(vec![Value::Str("Y".into()), Value::Str("a b".into())]));
        assert_eq!(module.vars["other"], Value::Bytes(b"x\r\ny".to_vec()));
    }
}
