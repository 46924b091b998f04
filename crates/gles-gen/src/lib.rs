//! Generates virtsoc's GLES remoting from the Khronos registry (`gl.xml`) and our own
//! annotation file (`gles.annot`, see [`annot`]): the opcodes ([`emit_opcodes`]), the guest
//! encoder and entry-point table ([`emit_guest`]), the host decoder and function table
//! ([`emit_host`]) (see `docs/gles.md`). Build scripts call [`build`]; the output goes to
//! `OUT_DIR` and is `include!`d.
//!
//! [`sizes`] holds the array-size functions both sides share (the guest's and the host's
//! `gl::sz` modules include that file).

pub mod annot;
mod emit;
pub mod registry;
pub mod sizes;

pub use annot::{CmdAnnot, Kind, NameMode, Shape, Spec};
pub use emit::{emit_guest, emit_host, emit_opcodes};
pub use registry::{CType, Command, Param};

/// What went wrong generating.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// The registry is unreadable or lacks something.
    #[error("registry: {0}")]
    Registry(String),
    /// The annotation file is malformed or incomplete.
    #[error("annotations: {0}")]
    Annot(String),
    /// Reading or writing a file.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// The registry's base feature: its commands are required of the host's driver.
pub const FEATURE: &str = "GL_ES_VERSION_2_0";
/// Every registry feature we generate, in order: the commands of those after the first are
/// optional on the host (a driver without OpenGL ES 3 still serves ES 2 contexts).
pub const FEATURES: &[&str] = &[FEATURE, "GL_ES_VERSION_3_0", "GL_ES_VERSION_3_1"];
/// Where Debian's `khronos-api` puts the registry (`$VIRTSOC_GL_XML` overrides).
pub const DEFAULT_GL_XML: &str = "/usr/share/khronos-api/gl.xml";
/// Our annotation file.
pub const ANNOT_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/gles.annot");

/// One command ready to generate: registry prototype, annotations, opcode.
#[derive(Debug, Clone)]
pub struct Cmd {
    /// The opcode (1..N).
    pub op: u32,
    /// The prototype.
    pub proto: Command,
    /// Its annotations (default when the file has none).
    pub annot: CmdAnnot,
    /// Each parameter's spec (`None`: a scalar sent as is).
    pub specs: Vec<Option<Spec>>,
    /// Optional on the host: an extension command or one of a feature after [`FEATURE`]
    /// (the host's table holds an `Option`; a call the driver lacks is `GL_INVALID_OPERATION`).
    pub optional: bool,
}

impl Cmd {
    /// Whether the call returns data, so is flushed and waits for the host's answer.
    pub fn round_trip(&self) -> bool {
        !matches!(self.annot.shape, Some(Shape::Create(_)))
            && (!self.proto.ret.is_void()
                || self.specs.iter().any(|s| matches!(s, Some(Spec::Out(_)))))
    }
}

/// Merges a registry and annotations into the list of commands with opcodes: the annotated
/// commands first (in the annotation file's order), then the features' others (in the
/// registry's order, [`FEATURES`] in turn). Fails on a pointer parameter without annotation (unless the command is
/// custom on both sides) and on annotations naming unknown parameters.
pub fn model(xml: &str, annot_text: &str) -> Result<Vec<Cmd>, GenError> {
    let annots = annot::parse(annot_text)?;
    let extra: Vec<String> = annots
        .iter()
        .filter(|a| a.ext)
        .map(|a| a.name.clone())
        .collect();
    let protos = registry::commands(xml, FEATURES, &extra)?;
    let base = registry::commands(xml, &[FEATURE], &[])?;
    for a in &annots {
        if !protos.iter().any(|p| p.name == a.name) {
            return Err(GenError::Annot(format!(
                "{} is neither in {FEATURES:?} nor marked ext",
                a.name
            )));
        }
    }
    let mut order: Vec<&Command> = Vec::new();
    for a in &annots {
        order.extend(protos.iter().filter(|p| p.name == a.name));
    }
    for p in &protos {
        if !annots.iter().any(|a| a.name == p.name) {
            order.push(p);
        }
    }
    let mut out = Vec::new();
    for (i, p) in order.into_iter().enumerate() {
        let a = annots
            .iter()
            .find(|a| a.name == p.name)
            .cloned()
            .unwrap_or_else(|| CmdAnnot {
                name: p.name.clone(),
                ..CmdAnnot::default()
            });
        for (pn, spec) in &a.params {
            if !p.params.iter().any(|x| &x.name == pn) {
                return Err(GenError::Annot(format!("{}: no parameter {pn}", p.name)));
            }
            let exprs: &[annot::Factor] = match spec {
                Spec::In { expr, .. } | Spec::Out(expr) | Spec::Unpack { expr, .. } => expr,
                _ => &[],
            };
            for f in exprs {
                let names: Vec<&String> = match f {
                    annot::Factor::Param(n) => vec![n],
                    annot::Factor::Call(_, args) => {
                        args.iter().filter(|x| x.parse::<i64>().is_err()).collect()
                    }
                    annot::Factor::Int(_) => vec![],
                };
                for n in names {
                    if !p.params.iter().any(|x| &x.name == n) {
                        return Err(GenError::Annot(format!(
                            "{}: {pn}'s length names {n}",
                            p.name
                        )));
                    }
                }
            }
        }
        let specs: Vec<Option<Spec>> = p
            .params
            .iter()
            .map(|x| {
                a.params
                    .iter()
                    .find(|(n, _)| *n == x.name)
                    .map(|(_, s)| s.clone())
            })
            .collect();
        let generic = !(a.custom_guest && a.custom_host) && a.shape.is_none();
        if generic {
            for (x, s) in p.params.iter().zip(&specs) {
                if x.ty.ptr > 0 && s.is_none() {
                    return Err(GenError::Annot(format!(
                        "{}: pointer parameter {} needs an annotation",
                        p.name, x.name
                    )));
                }
                if x.ty.ptr > 1 {
                    return Err(GenError::Annot(format!(
                        "{}: {} must be custom",
                        p.name, x.name
                    )));
                }
            }
            if p.ret.ptr > 0 {
                return Err(GenError::Annot(format!(
                    "{} returns a pointer: custom",
                    p.name
                )));
            }
        }
        let optional = a.ext || !base.iter().any(|b| b.name == p.name);
        out.push(Cmd {
            op: i as u32 + 1,
            proto: p.clone(),
            annot: a,
            specs,
            optional,
        });
    }
    Ok(out)
}

/// Which generated file a build script wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// `gl_ops.rs`: the opcodes (for `virtsoc-gles-stream`).
    Opcodes,
    /// `gl_guest.rs`: the guest encoder and entry-point table.
    Guest,
    /// `gl_host.rs`: the host decoder and function table.
    Host,
}

/// For a build script: reads the registry (`$VIRTSOC_GL_XML` or [`DEFAULT_GL_XML`]) and
/// [`ANNOT_PATH`], writes the wanted file into `$OUT_DIR` and tells cargo when to rerun.
pub fn build(what: Output) -> Result<(), GenError> {
    println!("cargo:rerun-if-env-changed=VIRTSOC_GL_XML");
    let xml_path = std::env::var("VIRTSOC_GL_XML").unwrap_or_else(|_| DEFAULT_GL_XML.to_owned());
    println!("cargo:rerun-if-changed={xml_path}");
    println!("cargo:rerun-if-changed={ANNOT_PATH}");
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| GenError::Io(p.to_owned(), e));
    let cmds = model(&read(&xml_path)?, &read(ANNOT_PATH)?)?;
    let (file, text) = match what {
        Output::Opcodes => ("gl_ops.rs", emit_opcodes(&cmds)),
        Output::Guest => ("gl_guest.rs", emit_guest(&cmds)),
        Output::Host => ("gl_host.rs", emit_host(&cmds)),
    };
    let dir = std::env::var("OUT_DIR").map_err(|_| GenError::Annot("no OUT_DIR".into()))?;
    let path = std::path::Path::new(&dir).join(file);
    std::fs::write(&path, text).map_err(|e| GenError::Io(path.display().to_string(), e))
}

#[cfg(test)]
mod tests;
