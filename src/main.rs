//! The `tandem` command (being written).
fn main() {}
