//! Compile-time behaviour of `#[derive(Retained)]`: inputs that must
//! compile, and inputs that must fail with clear messages (the expected
//! compiler output is in `tests/ui/fail/*.stderr`; regenerate it with
//! `TRYBUILD=overwrite cargo test -p cohort --test derive_ui`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
