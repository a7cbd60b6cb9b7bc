//! loadgen: the small-file workload generator. Not built yet: this binary only says so.

fn main() {
    eprintln!("loadgen: not implemented yet; see the project README for what ccfs can do today");
    std::process::exit(2);
}
