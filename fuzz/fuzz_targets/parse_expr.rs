//! The expression parser and type checker never panic, whatever the input.
#![no_main]

use attn_policy::typecheck::Compiler;
use attn_policy::lang::parse_expr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(ast) = parse_expr(text) {
            let mut c = Compiler::default();
            let _ = c.condition(&ast);
        }
    }
});
