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
    <proto>void <name>glTexSubImage3D</name></proto>
    <param><ptype>GLenum</ptype> <name>target</name></param>
    <param><ptype>GLint</ptype> <name>level</name></param>
    <param><ptype>GLint</ptype> <name>xoffset</name></param>
    <param><ptype>GLint</ptype> <name>yoffset</name></param>
    <param><ptype>GLint</ptype> <name>zoffset</name></param>
    <param><ptype>GLsizei</ptype> <name>width</name></param>
    <param><ptype>GLsizei</ptype> <name>height</name></param>
    <param><ptype>GLsizei</ptype> <name>depth</name></param>
    <param><ptype>GLenum</ptype> <name>format</name></param>
    <param><ptype>GLenum</ptype> <name>type</name></param>
    <param len="COMPSIZE(format,type,width,height,depth)">const void *<name>pixels</name></param>
  </command>
  <command>
    <proto><ptype>GLsync</ptype> <name>glFenceSync</name></proto>
    <param><ptype>GLenum</ptype> <name>condition</name></param>
    <param><ptype>GLbitfield</ptype> <name>flags</name></param>
  </command>
  <command>
    <proto>void <name>glGetInteger64v</name></proto>
    <param><ptype>GLenum</ptype> <name>pname</name></param>
    <param len="COMPSIZE(pname)"><ptype>GLint64</ptype> *<name>data</name></param>
  </command>
  <command>
    <proto>void <name>glGenVertexArrays</name></proto>
    <param><ptype>GLsizei</ptype> <name>n</name></param>
    <param len="n"><ptype>GLuint</ptype> *<name>arrays</name></param>
  </command>
  <command>
    <proto>void <name>glTransformFeedbackVaryings</name></proto>
    <param><ptype>GLuint</ptype> <name>program</name></param>
    <param><ptype>GLsizei</ptype> <name>count</name></param>
    <param len="count">const <ptype>GLchar</ptype> *const*<name>varyings</name></param>
    <param><ptype>GLenum</ptype> <name>bufferMode</name></param>
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
<feature api="gles2" name="GL_ES_VERSION_3_0" number="3.0">
  <require>
    <command name="glTexSubImage3D"/>
    <command name="glFenceSync"/>
    <command name="glGetInteger64v"/>
    <command name="glGenVertexArrays"/>
    <command name="glTransformFeedbackVaryings"/>
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
glTexSubImage3D pixels=unpack(teximage3d(width,height,depth,format,type))
glFenceSync custom=both
glGetInteger64v data=out(getv(pname))
glGenVertexArrays gen(vertexarray)
glTransformFeedbackVaryings custom=both
";

#[test]
fn prototypes_parse() {
    let cmds = registry::commands(XML, &[FEATURE], &["glMapBufferOES".into()]).unwrap();
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
            (5, "glTexSubImage3D"),
            (6, "glFenceSync"),
            (7, "glGetInteger64v"),
            (8, "glGenVertexArrays"),
            (9, "glTransformFeedbackVaryings"),
            (10, "glClear"),
        ]
    );
    // GLES 2.0 commands are required of the host, GLES 3.0 ones optional.
    assert!(cmds[..4].iter().chain(&cmds[9..]).all(|c| !c.optional));
    assert!(cmds[4..9].iter().all(|c| c.optional));
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
    assert!(ops.contains("pub const COUNT: u32 = 10;"));
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
    // GLES 3.0: a double pointer must be custom, a pixel array annotated.
    assert!(matches!(
        model(XML, "glTexImage2D pixels=in(1)\nglTransformFeedbackVaryings\nglTexSubImage3D pixels=unpack(1)\n"),
        Err(GenError::Annot(m)) if m.contains("varyings")
    ));
    let no_3d: String = ANNOT
        .lines()
        .filter(|l| !l.starts_with("glTexSubImage3D"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(matches!(
        model(XML, &no_3d),
        Err(GenError::Annot(m)) if m.contains("glTexSubImage3D") && m.contains("pixels")
    ));
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
    // GLES 2.0: 142 commands; GLES 3.0 adds 104, GLES 3.1 68.
    assert_eq!(cmds.iter().filter(|c| !c.annot.ext).count(), 142 + 104 + 68);
    assert_eq!(cmds.iter().filter(|c| !c.optional).count(), 142);
    assert!(cmds.iter().any(|c| c.proto.name == "glMapBufferOES"));
}

#[test]
fn es3_snippets_unpack_buffers_64_bit_values_and_new_kinds() {
    let cmds = model(XML, ANNOT).unwrap();
    let sub3d = cmds
        .iter()
        .find(|c| c.proto.name == "glTexSubImage3D")
        .unwrap();
    assert!(matches!(
        &sub3d.specs[10],
        Some(Spec::Unpack { nullable: false, expr }) if matches!(&expr[0], annot::Factor::Call(f, a) if f == "teximage3d" && a.len() == 5)
    ));
    assert!(!sub3d.round_trip());
    let i64v = cmds
        .iter()
        .find(|c| c.proto.name == "glGetInteger64v")
        .unwrap();
    assert!(i64v.round_trip());
    let fence = cmds.iter().find(|c| c.proto.name == "glFenceSync").unwrap();
    assert_eq!(emit::rust_type(&fence.proto.ret), "*mut std::ffi::c_void");
    let guest = emit_guest(&cmds);
    // With an unpack buffer bound the pointer travels as an offset.
    assert!(guest.contains("if sz::unpack_buffer_bound(&st)"));
    assert!(guest.contains("p.u32(1).u64(pixels as usize as u64);"));
    assert!(guest.contains("sz::teximage3d(&st, width as i64, height as i64, depth as i64"));
    // 8-byte elements for GLint64 arrays.
    assert!(guest.contains("sz::getv(&st, pname as i64), Some(8usize)"));
    assert!(guest.contains("st.new_names(Kind::VertexArray, cnt)"));
    assert!(guest.contains("b\"glFenceSync\" => super::custom::glFenceSync"));
    let host = emit_host(&cmds);
    // The host checks the offset against the buffer (es3::unpack_ptr) and holds an Option.
    assert!(host.contains("super::es3::unpack_ptr(gl, cx, b_pixels, off_pixels, n_pixels, false)"));
    assert!(host.contains("pub glTexSubImage3D: Option<unsafe extern \"C\" fn("));
    assert!(host.contains("pub glTexImage2D: unsafe extern \"C\" fn("));
    assert!(host.contains(
        "pub glFenceSync: Option<unsafe extern \"C\" fn(u32, u32) -> *mut std::ffi::c_void>,"
    ));
    assert!(host.contains("super::names::gen(gl, cx, Kind::VertexArray, r)"));
    assert!(host.contains(
        "let Some(f) = gl.glTexSubImage3D else { cx.error(super::GL_INVALID_OPERATION);"
    ));
    // An unknown object kind is refused.
    assert!(annot::parse("glGenVertexArrays gen(vao)\n").is_err());
}
