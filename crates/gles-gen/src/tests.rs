//! The generator on registry snippets.

use super::*;

const XML: &str = r#"<registry>
<commands namespace="GL">
  <command>
    <proto>void <name>glClear</name></proto>
    <param group="ClearBufferMask"><ptype>GLbitfield</ptype> <name>mask</name></param>
  </command>
  <command>
    <proto>void <name>glTexImage2D</name></proto>
    <param><ptype>GLenum</ptype> <name>target</name></param>
    <param><ptype>GLint</ptype> <name>level</name></param>
    <param><ptype>GLint</ptype> <name>internalformat</name></param>
    <param><ptype>GLsizei</ptype> <name>width</name></param>
    <param><ptype>GLsizei</ptype> <name>height</name></param>
    <param><ptype>GLint</ptype> <name>border</name></param>
    <param><ptype>GLenum</ptype> <name>format</name></param>
    <param><ptype>GLenum</ptype> <name>type</name></param>
    <param len="COMPSIZE(format,type,width,height)">const void *<name>pixels</name></param>
  </command>
  <command>
    <proto><ptype>GLint</ptype> <name>glGetUniformLocation</name></proto>
    <param class="program"><ptype>GLuint</ptype> <name>program</name></param>
    <param>const <ptype>GLchar</ptype> *<name>name</name></param>
  </command>
  <command>
    <proto>void <name>glGetIntegerv</name></proto>
    <param><ptype>GLenum</ptype> <name>pname</name></param>
    <param len="COMPSIZE(pname)"><ptype>GLint</ptype> *<name>data</name></param>
  </command>
  <command>
    <proto>void *<name>glMapBufferOES</name></proto>
    <param><ptype>GLenum</ptype> <name>target</name></param>
    <param><ptype>GLenum</ptype> <name>access</name></param>
  </command>
  <command>
    <proto>void <name>glGenBuffers</name></proto>
    <param><ptype>GLsizei</ptype> <name>n</name></param>
    <param len="n"><ptype>GLuint</ptype> *<name>buffers</name></param>
  </command>
</commands>
<feature api="gles2" name="GL_ES_VERSION_2_0" number="2.0">
  <require>
    <command name="glClear"/>
    <command name="glTexImage2D"/>
    <command name="glGetUniformLocation"/>
    <command name="glGetIntegerv"/>
    <command name="glGenBuffers"/>
  </require>
</feature>
</registry>"#;

const ANNOT: &str = "
# comment
glGetIntegerv data=out(getv(pname))   # a round trip
glTexImage2D pixels=in?(teximage(width,height,format,type)) hhook
glGetUniformLocation program=name(program) name=cstr
glGenBuffers gen(buffer)
";

#[test]
fn prototypes_parse() {
    let cmds = registry::commands(XML, FEATURE, &["glMapBufferOES".into()]).unwrap();
    let names: Vec<_> = cmds.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "glClear",
            "glTexImage2D",
            "glGetUniformLocation",
            "glGetIntegerv",
            "glGenBuffers",
            "glMapBufferOES"
        ]
    );
    let tex = &cmds[1];
    assert_eq!(tex.params.len(), 9);
    assert_eq!(
        tex.params[8].ty,
        CType {
            base: "void".into(),
            ptr: 1,
            is_const: true
        }
    );
    assert_eq!(
        tex.params[8].len.as_deref(),
        Some("COMPSIZE(format,type,width,height)")
    );
    assert_eq!(cmds[2].ret.base, "GLint");
    assert_eq!(
        cmds[5].ret,
        CType {
            base: "void".into(),
            ptr: 1,
            is_const: false
        }
    );
    assert_eq!(emit::rust_type(&cmds[5].ret), "*mut std::ffi::c_void");
}

#[test]
fn annotated_commands_come_first_and_round_trips_are_known() {
    let cmds = model(XML, ANNOT).unwrap();
    let order: Vec<_> = cmds.iter().map(|c| (c.op, c.proto.name.as_str())).collect();
    assert_eq!(
        order,
        [
            (1, "glGetIntegerv"),
            (2, "glTexImage2D"),
            (3, "glGetUniformLocation"),
            (4, "glGenBuffers"),
            (5, "glClear")
        ]
    );
    assert!(cmds[0].round_trip()); // out array
    assert!(!cmds[1].round_trip());
    assert!(cmds[2].round_trip()); // returns a value
    assert!(!cmds[3].round_trip());
    assert_eq!(
        cmds[1].specs[8],
        Some(Spec::In {
            expr: vec![annot::Factor::Call(
                "teximage".into(),
                vec![
                    "width".into(),
                    "height".into(),
                    "format".into(),
                    "type".into()
                ]
            )],
            nullable: true
        })
    );
    assert_eq!(
        cmds[2].specs[0],
        Some(Spec::Name(Kind::Program, NameMode::Use))
    );
}

#[test]
fn emitted_code_uses_size_functions_and_replies() {
    let cmds = model(XML, ANNOT).unwrap();
    let ops = emit_opcodes(&cmds);
    assert!(ops.contains("pub const glTexImage2D: u32 = 2;"));
    assert!(ops.contains("pub const COUNT: u32 = 5;"));
    let guest = emit_guest(&cmds);
    assert!(guest.contains("pub(crate) unsafe extern \"C\" fn glTexImage2D("));
    assert!(guest
        .contains("sz::teximage(&st, width as i64, height as i64, format as i64, type_ as i64)"));
    assert!(guest.contains("stream.round_trip()"));
    assert!(guest.contains("b\"glClear\" => self::glClear"));
    let host = emit_host(&cmds);
    assert!(host.contains("sz::teximage(cx, width as i64"));
    assert!(host.contains("super::hooks::glTexImage2D(gl, cx,"));
    assert!(host.contains("let mut p = reply.packet(op::glGetIntegerv);"));
    assert!(host.contains("op::glGenBuffers => d_glGenBuffers(gl, cx, r, reply),"));
    assert!(host.contains("cx.host_name(gl, Kind::Program, program, super::names::Mode::Use)"));
}

#[test]
fn unannotated_pointers_and_unknown_names_are_refused() {
    // glTexImage2D's pixels without an annotation.
    assert!(matches!(model(XML, "glClear\n"), Err(GenError::Annot(m)) if m.contains("pixels")));
    assert!(matches!(
        model(XML, "glClear mask=in(count)\n"),
        Err(GenError::Annot(_))
    ));
    assert!(matches!(model(XML, "glFoo\n"), Err(GenError::Annot(_))));
    assert!(matches!(
        model(XML, "glTexImage2D pixels=in(width*depth)\n"),
        Err(GenError::Annot(m)) if m.contains("depth")
    ));
    assert!(matches!(
        annot::parse("glClear bogus\n"),
        Err(GenError::Annot(_))
    ));
}

#[test]
fn the_real_registry_and_our_annotations_agree() {
    let xml = std::env::var("VIRTSOC_GL_XML").unwrap_or_else(|_| DEFAULT_GL_XML.to_owned());
    let Ok(xml) = std::fs::read_to_string(&xml) else {
        eprintln!("no {xml}: skipped");
        return;
    };
    let annot = std::fs::read_to_string(ANNOT_PATH).unwrap();
    let cmds = model(&xml, &annot).unwrap();
    assert_eq!(cmds.iter().filter(|c| !c.annot.ext).count(), 142);
    assert!(cmds.iter().any(|c| c.proto.name == "glMapBufferOES"));
}
