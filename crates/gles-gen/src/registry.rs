//! Reading the Khronos registry (`gl.xml`): the commands of features (`GL_ES_VERSION_2_0`,
//! `GL_ES_VERSION_3_0`) and of the extension commands we name, with their C prototypes.

use crate::GenError;

/// A C type as the registry spells it: a base type and pointer levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CType {
    /// `GLenum`, `GLuint`, ..., or `void`.
    pub base: String,
    /// Pointer levels (`const void *` is 1, `const GLchar *const*` is 2).
    pub ptr: u8,
    /// Whether the pointee is `const`.
    pub is_const: bool,
}

impl CType {
    /// Parses a C declaration's type text (`const GLubyte *`, `void`, `GLenum`).
    pub fn parse(text: &str) -> Result<CType, GenError> {
        let ptr = text.matches('*').count() as u8;
        let is_const = text.trim_start().starts_with("const");
        let base = text
            .replace('*', " ")
            .split_whitespace()
            .find(|w| *w != "const")
            .map(str::to_owned)
            .ok_or_else(|| GenError::Registry(format!("no type in {text:?}")))?;
        Ok(CType {
            base,
            ptr,
            is_const,
        })
    }

    /// Whether this is `void` with no pointer.
    pub fn is_void(&self) -> bool {
        self.base == "void" && self.ptr == 0
    }
}

/// A parameter of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name in the registry.
    pub name: String,
    /// Its type.
    pub ty: CType,
    /// The registry's `len` attribute, if any (informative: our annotations decide).
    pub len: Option<String>,
}

/// A command of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// `glXxx`.
    pub name: String,
    /// The return type.
    pub ret: CType,
    /// The parameters, in order.
    pub params: Vec<Param>,
}

/// Text of an element with the `<name>` child left out.
fn type_text(node: roxmltree::Node<'_, '_>) -> String {
    let mut s = String::new();
    for c in node.children() {
        if c.has_tag_name("name") {
            continue;
        }
        if c.is_text() {
            s.push_str(c.text().unwrap_or(""));
        } else if c.has_tag_name("ptype") {
            s.push(' ');
            s.push_str(c.text().unwrap_or(""));
            s.push(' ');
        }
    }
    s
}

fn child_name(node: roxmltree::Node<'_, '_>) -> Option<String> {
    node.children()
        .find(|c| c.has_tag_name("name"))
        .and_then(|c| c.text())
        .map(str::to_owned)
}

/// The commands of `features` (each one's `<require>`s, in registry order, the features in
/// the given order) followed by the `extra` commands (in the given order), each once. The
/// first feature must be in the registry; a later one it lacks (an older `gl.xml`) adds
/// nothing.
pub fn commands(xml: &str, features: &[&str], extra: &[String]) -> Result<Vec<Command>, GenError> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| GenError::Registry(e.to_string()))?;
    let mut all = std::collections::HashMap::new();
    for cmd in doc.descendants().filter(|n| n.has_tag_name("command")) {
        let Some(proto) = cmd.children().find(|c| c.has_tag_name("proto")) else {
            continue;
        };
        let name =
            child_name(proto).ok_or_else(|| GenError::Registry("command without a name".into()))?;
        let ret = CType::parse(&type_text(proto))?;
        let mut params = Vec::new();
        for p in cmd.children().filter(|c| c.has_tag_name("param")) {
            params.push(Param {
                name: child_name(p)
                    .ok_or_else(|| GenError::Registry(format!("{name}: unnamed param")))?,
                ty: CType::parse(&type_text(p))?,
                len: p.attribute("len").map(str::to_owned),
            });
        }
        all.insert(name.clone(), Command { name, ret, params });
    }
    let mut names: Vec<String> = Vec::new();
    for (i, feature) in features.iter().enumerate() {
        let found = doc
            .descendants()
            .find(|n| n.has_tag_name("feature") && n.attribute("name") == Some(feature));
        let feat = match found {
            Some(f) => f,
            None if i > 0 => continue,
            None => return Err(GenError::Registry(format!("no feature {feature}"))),
        };
        for req in feat.children().filter(|c| c.has_tag_name("require")) {
            for c in req.children().filter(|c| c.has_tag_name("command")) {
                if let Some(n) = c.attribute("name") {
                    if !names.iter().any(|x| x == n) {
                        names.push(n.to_owned());
                    }
                }
            }
        }
    }
    for e in extra {
        if !names.contains(e) {
            names.push(e.clone());
        }
    }
    names
        .into_iter()
        .map(|n| {
            all.remove(&n)
                .ok_or_else(|| GenError::Registry(format!("command {n} is not in the registry")))
        })
        .collect()
}
