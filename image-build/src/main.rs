//! image-build: assembles the ramdisk around the static agent. Not built yet (see the
//! image-build issue); this binary refuses to run rather than pretend.
fn main() {
    eprintln!("image-build: not implemented yet; see the image-build issue");
    std::process::exit(2);
}
