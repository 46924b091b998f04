//! Parsing of one AT command line (ITU-T V.250 syntax) into commands.
//!
//! A command line is `AT` followed by any number of commands:
//!
//! * basic commands: one letter and an optional number (`E0`, `V1`, `H`,
//!   `Z`), `&` and a letter (`&F`), S-registers (`S0=2`, `S3?`);
//! * the dial command `D`, whose dial string runs to the next `;` (a
//!   trailing `;` makes it a voice call) or the end of the line;
//! * extended commands: `+NAME` followed by nothing (execute), `?` (read),
//!   `=?` (test) or `=<args>` (set), separated from what follows by `;`.
//!
//! Arguments are comma separated; double-quoted strings may hold commas
//! and semicolons. Parsing never fails on content, only on syntax, and
//! reports syntax errors as `None` (the interpreter answers `ERROR`).

/// One argument of an extended command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Arg {
    /// The text, without surrounding quotes or whitespace.
    pub text: String,
    /// Whether it was written as a quoted string.
    pub quoted: bool,
}

impl Arg {
    /// Whether the argument was left out (`AT+CMGD=1,` has an empty second
    /// argument).
    pub fn is_empty(&self) -> bool {
        !self.quoted && self.text.is_empty()
    }

    /// The argument as a decimal number, if it is one.
    pub fn number(&self) -> Option<u32> {
        if self.quoted || self.text.is_empty() || self.text.len() > 9 {
            return None;
        }
        if !self.text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        self.text.parse().ok()
    }
}

/// What an extended command asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExtOp {
    /// `AT+X`
    Exec,
    /// `AT+X?`
    Read,
    /// `AT+X=?`
    Test,
    /// `AT+X=a,b,...`
    Set(Vec<Arg>),
}

/// One command of a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// A one-letter basic command (upper-cased) and its optional value.
    Basic { letter: u8, value: Option<u32> },
    /// `&<letter>[<value>]`.
    Ampersand { letter: u8, value: Option<u32> },
    /// `S<reg>=<value>`.
    SSet { reg: u32, value: u32 },
    /// `S<reg>?`.
    SRead { reg: u32 },
    /// `D<dial string>`; `voice` when it ended with `;`.
    Dial { number: String, voice: bool },
    /// `+NAME...` with the name upper-cased, `+` included.
    Extended { name: String, op: ExtOp },
}

/// Parses the text after the `AT` prefix. `None` on a syntax error.
pub(crate) fn parse_commands(body: &str) -> Option<Vec<Command>> {
    let bytes = body.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b' ' | b';' => i += 1,
            b'+' | b'%' | b'$' | b'*' | b'^' => {
                let start = i;
                i += 1;
                while i < bytes.len() && is_name_char(bytes[i]) {
                    i += 1;
                }
                if i == start + 1 {
                    return None;
                }
                let name = body[start..i].to_ascii_uppercase();
                let op = if bytes.get(i) == Some(&b'?') {
                    i += 1;
                    ExtOp::Read
                } else if bytes.get(i) == Some(&b'=') {
                    i += 1;
                    if bytes.get(i) == Some(&b'?') {
                        i += 1;
                        ExtOp::Test
                    } else {
                        let (args, next) = parse_args(body, i)?;
                        i = next;
                        ExtOp::Set(args)
                    }
                } else {
                    ExtOp::Exec
                };
                // An extended command must be followed by `;` or the end.
                while i < bytes.len() && bytes[i] == b' ' {
                    i += 1;
                }
                if i < bytes.len() && bytes[i] != b';' {
                    return None;
                }
                out.push(Command::Extended { name, op });
            }
            b'&' => {
                let letter = bytes.get(i + 1)?.to_ascii_uppercase();
                if !letter.is_ascii_alphabetic() {
                    return None;
                }
                let (value, next) = parse_number(bytes, i + 2)?;
                i = next;
                out.push(Command::Ampersand { letter, value });
            }
            _ if c.eq_ignore_ascii_case(&b'd') => {
                i += 1;
                let start = i;
                while i < bytes.len() && bytes[i] != b';' {
                    i += 1;
                }
                let number = body[start..i].trim().to_string();
                let voice = i < bytes.len();
                if voice {
                    i += 1;
                }
                out.push(Command::Dial { number, voice });
            }
            _ if c.eq_ignore_ascii_case(&b's') => {
                let (reg, next) = parse_number(bytes, i + 1)?;
                let reg = reg?;
                i = next;
                match bytes.get(i) {
                    Some(b'?') => {
                        i += 1;
                        out.push(Command::SRead { reg });
                    }
                    Some(b'=') => {
                        let (value, next) = parse_number(bytes, i + 1)?;
                        i = next;
                        out.push(Command::SSet {
                            reg,
                            value: value.unwrap_or(0),
                        });
                    }
                    _ => return None,
                }
            }
            _ if c.is_ascii_alphabetic() => {
                let (value, next) = parse_number(bytes, i + 1)?;
                i = next;
                out.push(Command::Basic {
                    letter: c.to_ascii_uppercase(),
                    value,
                });
            }
            _ => return None,
        }
    }
    Some(out)
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'!' | b'%' | b'-' | b'.' | b'/' | b':' | b'_')
}

/// Parses an optional decimal number at `i`. `None` if it overflows.
fn parse_number(bytes: &[u8], mut i: usize) -> Option<(Option<u32>, usize)> {
    let start = i;
    let mut value: u32 = 0;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        value = value
            .checked_mul(10)?
            .checked_add(u32::from(bytes[i] - b'0'))?;
        i += 1;
    }
    Some(((i > start).then_some(value), i))
}

/// Parses comma separated arguments from `i` up to an unquoted `;` or the
/// end. Returns the arguments and the index of the terminator. `None` on an
/// unterminated quote or junk after a quoted string.
fn parse_args(body: &str, mut i: usize) -> Option<(Vec<Arg>, usize)> {
    let bytes = body.as_bytes();
    let mut args = Vec::new();
    loop {
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let arg = if bytes.get(i) == Some(&b'"') {
            let start = i + 1;
            let end = start + bytes[start..].iter().position(|&b| b == b'"')?;
            i = end + 1;
            while i < bytes.len() && bytes[i] == b' ' {
                i += 1;
            }
            Arg {
                text: body[start..end].to_string(),
                quoted: true,
            }
        } else {
            let start = i;
            while i < bytes.len() && bytes[i] != b',' && bytes[i] != b';' {
                if bytes[i] == b'"' {
                    return None;
                }
                i += 1;
            }
            Arg {
                text: body[start..i].trim().to_string(),
                quoted: false,
            }
        };
        args.push(arg);
        match bytes.get(i) {
            Some(b',') => i += 1,
            None | Some(b';') => return Some((args, i)),
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(name: &str, op: ExtOp) -> Command {
        Command::Extended {
            name: name.to_string(),
            op,
        }
    }

    fn arg(text: &str, quoted: bool) -> Arg {
        Arg {
            text: text.to_string(),
            quoted,
        }
    }

    #[test]
    fn basic_chain() {
        assert_eq!(
            parse_commands("E0Q0V1").unwrap(),
            vec![
                Command::Basic {
                    letter: b'E',
                    value: Some(0)
                },
                Command::Basic {
                    letter: b'Q',
                    value: Some(0)
                },
                Command::Basic {
                    letter: b'V',
                    value: Some(1)
                },
            ]
        );
    }

    #[test]
    fn extended_forms() {
        assert_eq!(
            parse_commands("+COPS=3,0;+COPS?;+CREG=?;+CSQ").unwrap(),
            vec![
                ext("+COPS", ExtOp::Set(vec![arg("3", false), arg("0", false)])),
                ext("+COPS", ExtOp::Read),
                ext("+CREG", ExtOp::Test),
                ext("+CSQ", ExtOp::Exec),
            ]
        );
    }

    #[test]
    fn quoted_args_keep_commas_and_case() {
        assert_eq!(
            parse_commands("+cmgs=\"+1 555;, x\",145").unwrap(),
            vec![ext(
                "+CMGS",
                ExtOp::Set(vec![arg("+1 555;, x", true), arg("145", false)])
            )]
        );
    }

    #[test]
    fn dial_and_s_registers() {
        assert_eq!(
            parse_commands("S0=0D+15551234;H").unwrap(),
            vec![
                Command::SSet { reg: 0, value: 0 },
                Command::Dial {
                    number: "+15551234".into(),
                    voice: true
                },
                Command::Basic {
                    letter: b'H',
                    value: None
                },
            ]
        );
        assert_eq!(
            parse_commands("D123").unwrap(),
            vec![Command::Dial {
                number: "123".into(),
                voice: false
            }]
        );
    }

    #[test]
    fn syntax_errors() {
        for bad in [
            "+",
            "+CMGS=\"unterminated",
            "+CMGS=\"a\"b",
            "+CSQ?x",
            "S",
            "S0",
            "E99999999999",
            "#",
            "&",
        ] {
            assert_eq!(parse_commands(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn arg_numbers() {
        assert_eq!(arg("12", false).number(), Some(12));
        assert_eq!(arg("12", true).number(), None);
        assert_eq!(arg("-1", false).number(), None);
        assert_eq!(arg("", false).number(), None);
        assert_eq!(arg("9999999999", false).number(), None);
        assert!(arg("", false).is_empty());
        assert!(!arg("", true).is_empty());
    }
}
