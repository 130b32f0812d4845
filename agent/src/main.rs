//! The stock rivet-agent: the generic hardware manager plus exec plugins.
fn main() -> std::process::ExitCode {
    rivet_agent::run_with(rivet_hardware_managers::default_managers)
}
