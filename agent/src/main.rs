fn main() {
    eprintln!("rivet-agent: not built yet");
    std::process::exit(2);
}
