//! Our annotation file (`gles.annot`): what the registry does not say about a command.
//!
//! One command per line, `#` starts a comment; a line is the command's name followed by
//! space-separated items:
//!
//! - `ext`: an extension command to generate besides the feature's;
//! - `custom=guest|host|both`: hand-written on that side (the guest's `gl::custom`, the
//!   host's `gl::custom`), generated on the other;
//! - `ghook` / `hhook`: the generated guest entry point calls `gl::hooks::<cmd>` before it
//!   encodes / the generated host decoder calls `gl::hooks::<cmd>` after the driver call;
//! - `hcheck`: the host decoder asks `gl::hooks::check_<cmd>` before the driver call (with
//!   the decoded, translated arguments); `false` skips the call (the check recorded the
//!   error): what GLES 2.0 refuses but a newer host context would take;
//! - `gen(KIND)` (`n, names*`: names made in the guest), `delete(KIND)` (`n, names*`),
//!   `delete1(KIND)` (one name), `create(KIND)` (returns a name made in the guest);
//! - `PARAM=in(EXPR)`, `PARAM=in?(EXPR)` (may be null), `PARAM=out(EXPR)`: a pointer
//!   parameter read or written by GL, `EXPR` elements of its pointee (bytes for `void`);
//!   `EXPR` is a product (`*`) of integers, parameter names and size functions
//!   `f(a,b,...)` (`gl::sz::f(state, a, b, ...)` on both sides);
//! - `PARAM=unpack(EXPR)`, `PARAM=unpack?(EXPR)`: a pixel array GL reads, or, while a
//!   `GL_PIXEL_UNPACK_BUFFER` is bound, an offset into that buffer (the host checks the
//!   offset plus `EXPR` bytes against the buffer's size);
//! - `PARAM=cstr`: a NUL-terminated input string;
//! - `PARAM=name(KIND)`, `name(KIND,bind)` (an unknown name is created, as `glBind*`
//!   allows), `name(KIND,soft)` (an unknown name answers 0 without an error: `glIs*`).
//!
//! `KIND` is one of `buffer texture framebuffer renderbuffer program shader query sampler
//! vertexarray transformfeedback programpipeline`.

use crate::GenError;

/// Kinds of GL objects whose names the host translates, as the annotations spell them: the
/// generated code names the variant of the same name of `virtsoc_gles_stream::Kind`, the
/// type both sides use at run time (this crate is their build dependency, not a run-time one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Buffer objects.
    Buffer,
    /// Textures.
    Texture,
    /// Framebuffer objects.
    Framebuffer,
    /// Renderbuffers.
    Renderbuffer,
    /// Programs.
    Program,
    /// Shaders.
    Shader,
    /// Query objects (GLES 3).
    Query,
    /// Sampler objects (GLES 3).
    Sampler,
    /// Vertex array objects (GLES 3).
    VertexArray,
    /// Transform feedback objects (GLES 3).
    TransformFeedback,
    /// Program pipeline objects (GLES 3.1).
    ProgramPipeline,
}

impl Kind {
    fn parse(s: &str) -> Result<Kind, GenError> {
        Ok(match s {
            "buffer" => Kind::Buffer,
            "texture" => Kind::Texture,
            "framebuffer" => Kind::Framebuffer,
            "renderbuffer" => Kind::Renderbuffer,
            "program" => Kind::Program,
            "shader" => Kind::Shader,
            "query" => Kind::Query,
            "sampler" => Kind::Sampler,
            "vertexarray" => Kind::VertexArray,
            "transformfeedback" => Kind::TransformFeedback,
            "programpipeline" => Kind::ProgramPipeline,
            _ => return Err(GenError::Annot(format!("unknown object kind {s:?}"))),
        })
    }

    /// The variant's name in the generated code (`Kind::Buffer`).
    pub fn rust(self) -> &'static str {
        match self {
            Kind::Buffer => "Kind::Buffer",
            Kind::Texture => "Kind::Texture",
            Kind::Framebuffer => "Kind::Framebuffer",
            Kind::Renderbuffer => "Kind::Renderbuffer",
            Kind::Program => "Kind::Program",
            Kind::Shader => "Kind::Shader",
            Kind::Query => "Kind::Query",
            Kind::Sampler => "Kind::Sampler",
            Kind::VertexArray => "Kind::VertexArray",
            Kind::TransformFeedback => "Kind::TransformFeedback",
            Kind::ProgramPipeline => "Kind::ProgramPipeline",
        }
    }
}

/// How the host treats a name it does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameMode {
    /// A GL error; the call is skipped.
    Use,
    /// Created on the host (`glBind*`).
    Bind,
    /// The call answers 0, no error (`glIs*`).
    Soft,
}

/// A factor of a length expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Factor {
    /// A constant.
    Int(u64),
    /// A parameter of the command.
    Param(String),
    /// A size function and its arguments (parameter names or integers).
    Call(String, Vec<String>),
}

/// A length expression: the product of its factors.
pub type Expr = Vec<Factor>;

/// What a parameter is, beyond its C type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// Input array of `expr` elements.
    In {
        /// Its length in elements.
        expr: Expr,
        /// Whether null is allowed.
        nullable: bool,
    },
    /// Output array of `expr` elements.
    Out(Expr),
    /// Pixels GL reads: `expr` bytes from the caller, or an offset into the bound
    /// `GL_PIXEL_UNPACK_BUFFER`.
    Unpack {
        /// Its length in elements.
        expr: Expr,
        /// Whether null is allowed (without a buffer bound).
        nullable: bool,
    },
    /// NUL-terminated input string.
    Cstr,
    /// An object name.
    Name(Kind, NameMode),
}

/// The shape of a command that makes or deletes names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `glGen*(n, names*)`.
    Gen(Kind),
    /// `glDelete*(n, names*)`.
    Delete(Kind),
    /// `glDelete*(name)`.
    Delete1(Kind),
    /// `glCreate*(...)` returning a name.
    Create(Kind),
}

/// The annotations of one command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmdAnnot {
    /// The command.
    pub name: String,
    /// An extension command to include.
    pub ext: bool,
    /// Hand-written in the guest.
    pub custom_guest: bool,
    /// Hand-written on the host.
    pub custom_host: bool,
    /// Guest hook before encoding.
    pub ghook: bool,
    /// Host hook after the driver call.
    pub hhook: bool,
    /// Host check before the driver call.
    pub hcheck: bool,
    /// Gen/delete/create shape.
    pub shape: Option<Shape>,
    /// Parameter annotations by name.
    pub params: Vec<(String, Spec)>,
}

fn parse_expr(s: &str) -> Result<Expr, GenError> {
    let mut out = Vec::new();
    for f in s.split('*') {
        let f = f.trim();
        if f.is_empty() {
            return Err(GenError::Annot(format!("empty factor in {s:?}")));
        }
        if let Ok(v) = f.parse::<u64>() {
            out.push(Factor::Int(v));
        } else if let Some((fname, rest)) = f.split_once('(') {
            let args = rest
                .strip_suffix(')')
                .ok_or_else(|| GenError::Annot(format!("unclosed call in {s:?}")))?;
            let args = args
                .split(',')
                .map(|a| a.trim().to_owned())
                .filter(|a| !a.is_empty());
            out.push(Factor::Call(fname.to_owned(), args.collect()));
        } else if f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(Factor::Param(f.to_owned()));
        } else {
            return Err(GenError::Annot(format!("bad factor {f:?}")));
        }
    }
    Ok(out)
}

fn inner<'a>(s: &'a str, head: &str) -> Option<&'a str> {
    s.strip_prefix(head)?.strip_prefix('(')?.strip_suffix(')')
}

/// Parses an annotation file.
pub fn parse(text: &str) -> Result<Vec<CmdAnnot>, GenError> {
    let mut out: Vec<CmdAnnot> = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut items = line.split_whitespace();
        let Some(name) = items.next() else { continue };
        let err = |m: String| GenError::Annot(format!("line {}: {name}: {m}", ln + 1));
        if out.iter().any(|a| a.name == name) {
            return Err(err("annotated twice".into()));
        }
        let mut a = CmdAnnot {
            name: name.to_owned(),
            ..CmdAnnot::default()
        };
        for it in items {
            match it {
                "ext" => a.ext = true,
                "ghook" => a.ghook = true,
                "hhook" => a.hhook = true,
                "hcheck" => a.hcheck = true,
                "custom=guest" => a.custom_guest = true,
                "custom=host" => a.custom_host = true,
                "custom=both" => (a.custom_guest, a.custom_host) = (true, true),
                _ => {
                    if let Some((p, spec)) = it.split_once('=') {
                        let spec = if spec == "cstr" {
                            Spec::Cstr
                        } else if let Some(e) = inner(spec, "in") {
                            Spec::In {
                                expr: parse_expr(e).map_err(|e| err(e.to_string()))?,
                                nullable: false,
                            }
                        } else if let Some(e) = inner(spec, "in?") {
                            Spec::In {
                                expr: parse_expr(e).map_err(|e| err(e.to_string()))?,
                                nullable: true,
                            }
                        } else if let Some(e) = inner(spec, "unpack") {
                            Spec::Unpack {
                                expr: parse_expr(e).map_err(|e| err(e.to_string()))?,
                                nullable: false,
                            }
                        } else if let Some(e) = inner(spec, "unpack?") {
                            Spec::Unpack {
                                expr: parse_expr(e).map_err(|e| err(e.to_string()))?,
                                nullable: true,
                            }
                        } else if let Some(e) = inner(spec, "out") {
                            Spec::Out(parse_expr(e).map_err(|e| err(e.to_string()))?)
                        } else if let Some(k) = inner(spec, "name") {
                            let (k, mode) = match k.split_once(',') {
                                Some((k, "bind")) => (k, NameMode::Bind),
                                Some((k, "soft")) => (k, NameMode::Soft),
                                Some((_, m)) => return Err(err(format!("unknown name mode {m}"))),
                                None => (k, NameMode::Use),
                            };
                            Spec::Name(Kind::parse(k)?, mode)
                        } else {
                            return Err(err(format!("unknown spec {spec:?}")));
                        };
                        a.params.push((p.to_owned(), spec));
                    } else {
                        let shape = if let Some(k) = inner(it, "gen") {
                            Shape::Gen(Kind::parse(k)?)
                        } else if let Some(k) = inner(it, "delete") {
                            Shape::Delete(Kind::parse(k)?)
                        } else if let Some(k) = inner(it, "delete1") {
                            Shape::Delete1(Kind::parse(k)?)
                        } else if let Some(k) = inner(it, "create") {
                            Shape::Create(Kind::parse(k)?)
                        } else {
                            return Err(err(format!("unknown item {it:?}")));
                        };
                        a.shape = Some(shape);
                    }
                }
            }
        }
        out.push(a);
    }
    Ok(out)
}
