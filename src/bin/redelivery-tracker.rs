//! The `redelivery-tracker` binary: see `redelivery-tracker --help`.

fn main() -> std::process::ExitCode {
    kafka_redelivery::cli::main()
}
