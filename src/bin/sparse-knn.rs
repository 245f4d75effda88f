//! The `sparse-knn` command line; everything lives in `datafusion_sparse_knn::cli`.

fn main() -> std::process::ExitCode {
    datafusion_sparse_knn::cli::main()
}
