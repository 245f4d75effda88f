//! `sparse-knn serve`: a Flight SQL client (arrow-flight's, as ADBC and JDBC speak it) against a
//! server on 127.0.0.1 started by each test: the answers equal the local engine's; a wrong or
//! missing token, a path outside the roots in any form, and a write are refused; a client that
//! goes away or passes the deadline frees its slot; clients side by side get their own answers;
//! the memory pool is back to empty after 1,000 statements. Every wait is bounded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_sparse_knn::serve::{
    served_session, Limits, ReadRoots, ServeOptions, Server, Token,
};
use futures::TryStreamExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const NEWS20: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/news20_bow.parquet");
const KOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/kos_bow.parquet");
/// Every wait of these tests ends within this.
const PATIENCE: Duration = Duration::from_secs(60);

/// A root holding `docs.parquet` (news20) and `links/` (a symbolic link to a file outside),
/// and beside it `outside/secret.parquet` (kos), which no client may read.
struct Folders {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn folders() -> Folders {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("links")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::copy(NEWS20, root.join("docs.parquet")).unwrap();
    std::fs::copy(KOS, outside.join("secret.parquet")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(
        outside.join("secret.parquet"),
        root.join("links/secret.parquet"),
    )
    .unwrap();
    Folders {
        _dir: dir,
        root,
        outside,
    }
}

fn limits() -> Limits {
    Limits {
        allow_writes: false,
        max_statements: 4,
        statement_timeout: None,
    }
}

/// A server over `folders.root` with the table `docs`, and a handle on its session.
async fn start(folders: &Folders, token: Option<&str>, limits: Limits) -> (Server, SessionContext) {
    let roots = ReadRoots::new([&folders.root]).unwrap();
    let ctx = served_session(&roots, Some(1 << 30)).unwrap();
    ctx.register_parquet(
        "docs",
        folders.root.join("docs.parquet").to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await
    .unwrap();
    let options = ServeOptions {
        bind: "127.0.0.1:0".parse().unwrap(),
        token: token.map_or_else(Token::none, |t| Token::new(t).unwrap()),
        tls: None,
        limits,
    };
    let server = Server::start(ctx.clone(), options).await.unwrap();
    (server, ctx)
}

/// The same table in a session of the local engine (`sparse-knn sql`'s, with URL tables).
async fn local(folders: &Folders) -> SessionContext {
    let ctx = datafusion_sparse_knn::cli::session().unwrap();
    ctx.register_parquet(
        "docs",
        folders.root.join("docs.parquet").to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await
    .unwrap();
    ctx
}

async fn client(addr: SocketAddr, token: Option<&str>) -> FlightSqlServiceClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(PATIENCE)
        .connect()
        .await
        .unwrap();
    let mut client = FlightSqlServiceClient::new(channel);
    if let Some(token) = token {
        client.set_token(token.to_string());
    }
    client
}

async fn query(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<Vec<RecordBatch>, FlightError> {
    let info = client.execute(sql.to_string(), None).await?;
    fetch(client, info).await
}

/// Every endpoint's rows of a result.
async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: arrow_flight::FlightInfo,
) -> Result<Vec<RecordBatch>, FlightError> {
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let stream = client.do_get(endpoint.ticket.unwrap()).await?;
        batches.extend(stream.try_collect::<Vec<_>>().await?);
    }
    Ok(batches)
}

async fn local_query(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

fn text(batches: &[RecordBatch]) -> String {
    pretty_format_batches(batches).unwrap().to_string()
}

fn refusal(result: Result<Vec<RecordBatch>, FlightError>) -> (tonic::Code, String) {
    match result {
        Ok(b) => panic!("expected a refusal, got {}", text(&b)),
        Err(FlightError::Tonic(status)) => (status.code(), status.message().to_string()),
        Err(other) => panic!("expected a status, got {other}"),
    }
}

/// The news20 cut holds every third post: ids 1, 4, 7, ... (3 i + 1 for i < 3,700 at least).
fn doc(i: i64) -> i64 {
    3 * i + 1
}

fn lookup(doc_id: i64) -> String {
    format!(
        "SELECT * FROM knn_join((SELECT * FROM docs WHERE doc_id = {doc_id}), docs, 'cosine', 5, 'device=cpu') ORDER BY rank"
    )
}

async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_equal_the_local_engine_for_statements_and_prepared_statements() {
    let folders = folders();
    let (server, _) = start(&folders, None, limits()).await;
    let reference = local(&folders).await;
    let mut c = client(server.addr(), None).await;
    let docs = folders.root.join("docs.parquet");
    let docs = docs.display();
    let statements = [
        lookup(doc(1)),
        "SELECT count(*) AS n, sum(rank) AS ranks FROM knn_join(docs, docs, 'cosine', 3, 'device=cpu')".to_string(),
        format!("SELECT * FROM knn_join((SELECT * FROM docs WHERE newsgroup = 'comp.graphics' AND doc_id < 700), '{docs}', 'manhattan', 4, 'device=cpu') ORDER BY 1, rank"),
        "SELECT count(*) FROM radius_join((SELECT * FROM docs WHERE doc_id < 50), docs, 'cosine', 0.5, 'device=cpu')".to_string(),
        format!("SELECT count(*), min(doc_id) FROM '{docs}'"),
        "SELECT sparse_nnz(vec) AS nnz FROM docs ORDER BY doc_id LIMIT 7".to_string(),
    ];
    for sql in &statements {
        let served = bounded(sql, query(&mut c, sql)).await.unwrap();
        let expected = local_query(&reference, sql).await;
        assert_eq!(text(&served), text(&expected), "{sql}");
        assert!(
            served.iter().map(|b| b.num_rows()).sum::<usize>() > 0,
            "{sql}"
        );
    }
    // Prepared statements (what the JDBC driver sends).
    let sql = lookup(doc(3));
    let mut prepared = c.prepare(sql.clone(), None).await.unwrap();
    let info = prepared.execute().await.unwrap();
    let served = fetch(&mut c, info).await.unwrap();
    prepared.close().await.unwrap();
    assert_eq!(text(&served), text(&local_query(&reference, &sql).await));
    // With a parameter, bound by the client for each run (a lookup by key, as an application
    // sends it); its type comes back in the parameter schema.
    let template = "SELECT * FROM knn_join((SELECT * FROM docs WHERE doc_id = $1), docs, \
                    'cosine', 5, 'device=cpu') ORDER BY rank";
    let mut prepared = c.prepare(template.to_string(), None).await.unwrap();
    let parameters = prepared.parameter_schema().unwrap().clone();
    assert_eq!(parameters.fields().len(), 1, "{parameters:?}");
    assert_eq!(parameters.field(0).name(), "$1");
    let (code, message) = refusal(prepared.execute().await.map(|_| Vec::new()));
    assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
    assert!(message.contains("$1"), "{message}");
    for id in [doc(5), doc(9)] {
        let value = arrow::array::Int64Array::from(vec![id]);
        let batch = RecordBatch::try_from_iter([("$1", std::sync::Arc::new(value) as _)]).unwrap();
        prepared.set_parameters(batch).unwrap();
        let info = prepared.execute().await.unwrap();
        let served = fetch(&mut c, info).await.unwrap();
        assert_eq!(
            text(&served),
            text(&local_query(&reference, &lookup(id)).await),
            "doc_id = {id}"
        );
    }
    // JDBC's `?` placeholders, numbered in order; a `?` in a string is text.
    let template = "SELECT '?' AS mark, doc_id FROM docs WHERE doc_id = ? OR doc_id = ? \
                    ORDER BY doc_id";
    let mut marked = c.prepare(template.to_string(), None).await.unwrap();
    let names: Vec<String> = marked
        .parameter_schema()
        .unwrap()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["$1", "$2"]);
    let (a, b) = (doc(7), doc(2));
    marked
        .set_parameters(
            RecordBatch::try_from_iter([
                (
                    "$1",
                    std::sync::Arc::new(arrow::array::Int64Array::from(vec![a])) as _,
                ),
                (
                    "$2",
                    std::sync::Arc::new(arrow::array::Int64Array::from(vec![b])) as _,
                ),
            ])
            .unwrap(),
        )
        .unwrap();
    let info = marked.execute().await.unwrap();
    let served = fetch(&mut c, info).await.unwrap();
    let written_out = format!(
        "SELECT '?' AS mark, doc_id FROM docs WHERE doc_id = {a} OR doc_id = {b} ORDER BY doc_id"
    );
    assert_eq!(
        text(&served),
        text(&local_query(&reference, &written_out).await)
    );
    assert_eq!(served.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    marked.close().await.unwrap();
    // Two rows of values at once are refused with a reason.
    let two = arrow::array::Int64Array::from(vec![doc(1), doc(2)]);
    prepared
        .set_parameters(
            RecordBatch::try_from_iter([("$1", std::sync::Arc::new(two) as _)]).unwrap(),
        )
        .unwrap();
    let (code, message) = refusal(prepared.execute().await.map(|_| Vec::new()));
    assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
    assert!(message.contains("one row"), "{message}");
    prepared.close().await.unwrap();
    // A bad statement is the client's error, with DataFusion's message; the server goes on.
    let (code, message) = refusal(query(&mut c, "SELECT * FROM no_such_table").await);
    assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
    assert!(message.contains("no_such_table"), "{message}");
    let (_, message) =
        refusal(query(&mut c, "SELECT * FROM knn_join(docs, docs, 'cosine', -1)").await);
    assert!(message.contains("knn_join"), "{message}");
    assert_eq!(
        text(&query(&mut c, &lookup(doc(1))).await.unwrap()),
        text(&local_query(&reference, &lookup(doc(1))).await)
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tools_can_browse_the_catalogue() {
    use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables};
    let folders = folders();
    let (server, _) = start(&folders, None, limits()).await;
    let mut c = client(server.addr(), None).await;
    let info = c.get_catalogs().await.unwrap();
    let catalogs = text(&fetch(&mut c, info).await.unwrap());
    assert!(catalogs.contains("datafusion"), "{catalogs}");
    let info = c
        .get_db_schemas(CommandGetDbSchemas {
            catalog: Some("datafusion".into()),
            db_schema_filter_pattern: None,
        })
        .await
        .unwrap();
    let schemas = text(&fetch(&mut c, info).await.unwrap());
    assert!(schemas.contains("public"), "{schemas}");
    let info = c
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: Some("public".into()),
            table_name_filter_pattern: Some("do%".into()),
            table_types: vec![],
            include_schema: true,
        })
        .await
        .unwrap();
    let tables = fetch(&mut c, info).await.unwrap();
    let listed = text(&tables);
    assert!(
        listed.contains("| docs ") && listed.contains("TABLE"),
        "{listed}"
    );
    assert_eq!(
        tables.iter().map(|b| b.num_rows()).sum::<usize>(),
        1,
        "{listed}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_or_missing_token_is_refused() {
    let folders = folders();
    let (server, _) = start(&folders, Some("a-long-secret-token"), limits()).await;
    for token in [
        None,
        Some("a-long-secret-tokem"),
        Some("a-long-secret"),
        Some(""),
    ] {
        let mut c = client(server.addr(), token).await;
        let (code, message) = refusal(query(&mut c, "SELECT 1").await);
        assert_eq!(code, tonic::Code::Unauthenticated, "{token:?}: {message}");
        assert!(!message.contains("secret"), "{message}");
    }
    let mut c = client(server.addr(), Some("a-long-secret-token")).await;
    let rows = query(&mut c, "SELECT count(*) AS n FROM docs")
        .await
        .unwrap();
    assert!(text(&rows).contains("4275"), "{}", text(&rows));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_without_a_token_listens_on_loopback_only() {
    let folders = folders();
    let roots = ReadRoots::new([&folders.root]).unwrap();
    let ctx = served_session(&roots, None).unwrap();
    let options = ServeOptions {
        bind: "0.0.0.0:0".parse().unwrap(),
        token: Token::none(),
        tls: None,
        limits: limits(),
    };
    let Err(e) = Server::start(ctx, options).await else {
        panic!("a server on every interface without a token started");
    };
    assert!(e.to_string().contains("without a token"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paths_outside_the_roots_are_refused_in_every_form() {
    let folders = folders();
    let (server, _) = start(&folders, None, limits()).await;
    let mut c = client(server.addr(), None).await;
    let secret = folders.outside.join("secret.parquet");
    let secret = secret.display();
    let dotted = folders.root.join("../outside/secret.parquet");
    let dotted = dotted.display();
    let link = folders.root.join("links/secret.parquet");
    let link = link.display();
    let links = folders.root.join("links/");
    let links = links.display();
    // Index files, one under the root and one outside.
    for (parquet, index) in [
        (
            folders.root.join("docs.parquet"),
            folders.root.join("docs.skidx"),
        ),
        (
            folders.outside.join("secret.parquet"),
            folders.outside.join("secret.skidx"),
        ),
    ] {
        let local = datafusion_sparse_knn::session_context();
        let frame = local
            .read_parquet(parquet.to_str().unwrap(), Default::default())
            .await
            .unwrap();
        datafusion_sparse_knn::index::SparseIndex::build(frame, &["cosine"], "")
            .await
            .unwrap()
            .save(&index)
            .unwrap();
    }
    let secret_index = folders.outside.join("secret.skidx");
    let secret_index = secret_index.display();
    let outside = folders.outside.display();
    let attempts = [
        format!("SELECT count(*) FROM '{secret_index}'"),
        format!("SELECT count(*) FROM knn_join(docs, '{secret_index}', 'cosine', 1)"),
        format!("SELECT count(*) FROM knn_join(docs, '{secret}', 'cosine', 1)"),
        format!("SELECT count(*) FROM knn_join('{secret}', docs, 'cosine', 1)"),
        format!("SELECT count(*) FROM knn_join(docs, '{outside}', 'cosine', 1)"),
        format!("SELECT count(*) FROM '{secret}'"),
        format!("SELECT count(*) FROM 'file://{secret}'"),
        format!("SELECT count(*) FROM '{dotted}'"),
        format!("SELECT count(*) FROM knn_join(docs, '{dotted}', 'cosine', 1)"),
        format!("SELECT count(*) FROM '{link}'"),
        format!("SELECT count(*) FROM knn_join(docs, '{link}', 'cosine', 1)"),
        format!("SELECT count(*) FROM '{links}'"),
        "SELECT count(*) FROM '/etc/passwd'".to_string(),
        "SELECT count(*) FROM 's3://bucket/data.parquet'".to_string(),
        "SELECT count(*) FROM knn_join(docs, 's3://bucket/data.parquet', 'cosine', 1)".to_string(),
    ];
    for sql in &attempts {
        let (code, message) = refusal(bounded(sql, query(&mut c, sql)).await);
        assert!(
            message.contains("outside the folders this server reads")
                || message.contains("reads local files only"),
            "{sql}: {code:?} {message}"
        );
        assert!(
            matches!(
                code,
                tonic::Code::PermissionDenied | tonic::Code::InvalidArgument
            ),
            "{sql}: {code:?} {message}"
        );
    }
    // SQL cannot widen the roots.
    let (code, _) = refusal(query(&mut c, "SET sparse_knn_serve.allow_path = '/'").await);
    assert_eq!(code, tonic::Code::PermissionDenied);
    let rows = query(&mut c, "SELECT count(*) AS n FROM docs")
        .await
        .unwrap();
    assert!(text(&rows).contains("4275"));
    // The index file under the root: its stored rows.
    let inside = format!(
        "SELECT count(*) AS n FROM '{}'",
        folders.root.join("docs.skidx").display()
    );
    let rows = query(&mut c, &inside).await.unwrap();
    assert!(text(&rows).contains("4275"), "{}", text(&rows));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statements_that_write_are_refused_unless_allowed() {
    let folders = folders();
    let (server, ctx) = start(&folders, None, limits()).await;
    let mut c = client(server.addr(), None).await;
    let out = folders.root.join("out.parquet");
    let writes = [
        format!("COPY (SELECT doc_id FROM docs) TO '{}'", out.display()),
        "CREATE TABLE t AS SELECT doc_id FROM docs".to_string(),
        "CREATE VIEW v AS SELECT doc_id FROM docs".to_string(),
        format!(
            "CREATE EXTERNAL TABLE more STORED AS PARQUET LOCATION '{}'",
            folders.root.join("docs.parquet").display()
        ),
        "INSERT INTO docs SELECT * FROM docs".to_string(),
        "DROP TABLE docs".to_string(),
        "SET datafusion.execution.batch_size = 1".to_string(),
        "SET sparse_knn.device = 'gpu'".to_string(),
    ];
    for sql in &writes {
        let (code, message) = refusal(query(&mut c, sql).await);
        assert_eq!(code, tonic::Code::PermissionDenied, "{sql}: {message}");
        assert!(message.contains("read-only"), "{sql}: {message}");
    }
    assert!(!out.exists());
    assert!(ctx.table_exist("docs").unwrap());
    assert!(!ctx.table_exist("t").unwrap());
    assert_eq!(ctx.state().config().batch_size(), 8192);
    server.stop().await.unwrap();

    // With --allow-writes: the catalogue changes for every client, but writes and reads stay
    // under the roots.
    let (server, ctx) = start(
        &folders,
        None,
        Limits {
            allow_writes: true,
            ..limits()
        },
    )
    .await;
    let mut c = client(server.addr(), None).await;
    query(
        &mut c,
        "CREATE TABLE t AS SELECT doc_id FROM docs WHERE doc_id < 10",
    )
    .await
    .unwrap();
    let mut other = client(server.addr(), None).await;
    let rows = query(&mut other, "SELECT count(*) AS n FROM t")
        .await
        .unwrap();
    let expected = local_query(&ctx, "SELECT count(*) AS n FROM docs WHERE doc_id < 10").await;
    assert_eq!(text(&rows), text(&expected));
    let escaped = folders.outside.join("written.parquet");
    let sql = format!("COPY (SELECT doc_id FROM docs) TO '{}'", escaped.display());
    let (_, message) = refusal(query(&mut c, &sql).await);
    assert!(message.contains("outside the folders"), "{message}");
    assert!(!escaped.exists());
    assert!(ctx.table_exist("t").unwrap());
    server.stop().await.unwrap();
}

/// Long enough never to end within a test: a three-way cross join of 4,275 rows.
const ENDLESS: &str =
    "SELECT count(*) FROM docs a, docs b, docs c WHERE a.doc_id + b.doc_id + c.doc_id < 0";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_goes_away_ends_its_statement_and_frees_its_slot() {
    let folders = folders();
    // One slot: the next statement runs only if the abandoned one gave its slot back.
    let (server, ctx) = start(
        &folders,
        None,
        Limits {
            max_statements: 1,
            ..limits()
        },
    )
    .await;
    let addr = server.addr();
    let abandoned = tokio::spawn(async move {
        let mut c = client(addr, None).await;
        query(&mut c, ENDLESS).await
    });
    // Let it start, then kill the client mid-query (its connection closes with the task).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!abandoned.is_finished(), "the endless statement ended");
    abandoned.abort();
    let mut c = client(addr, None).await;
    let rows = bounded(
        "a statement after an abandoned one",
        query(&mut c, &lookup(doc(5))),
    )
    .await
    .unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
    // With the kept index of the lookup dropped, nothing stays reserved: the abandoned cross
    // join's buffers are gone too.
    ctx.state()
        .config()
        .get_extension::<datafusion_sparse_knn::index::IndexCache>()
        .expect("the session keeps indexes")
        .clear();
    let started = Instant::now();
    while ctx.runtime_env().memory_pool.reserved() != 0 {
        assert!(started.elapsed() < PATIENCE, "memory still reserved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_past_the_timeout_is_cancelled() {
    let folders = folders();
    let (server, _) = start(
        &folders,
        None,
        Limits {
            max_statements: 1,
            statement_timeout: Some(Duration::from_secs(2)),
            ..limits()
        },
    )
    .await;
    let mut c = client(server.addr(), None).await;
    let started = Instant::now();
    let (code, message) = refusal(bounded("the endless statement", query(&mut c, ENDLESS)).await);
    assert_eq!(code, tonic::Code::DeadlineExceeded, "{message}");
    assert!(message.contains("statement timeout"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // Its slot is free again. The next statement is one that ends well inside the timeout on a
    // busy machine: a first lookup builds an index, which a loaded CI runner took >400 ms for.
    let rows = bounded(
        "the next statement",
        query(&mut c, "SELECT count(*) AS n FROM docs"),
    )
    .await
    .unwrap();
    let counted = text(&rows);
    assert!(counted.contains("4275"), "{counted}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_side_by_side_get_their_own_answers() {
    let folders = folders();
    let (server, _) = start(&folders, None, limits()).await;
    let reference = local(&folders).await;
    let mut expected = Vec::new();
    for id in 0..40i64 {
        expected.push(text(&local_query(&reference, &lookup(doc(id * 31))).await));
    }
    let expected = std::sync::Arc::new(expected);
    let addr = server.addr();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let expected = std::sync::Arc::clone(&expected);
            tokio::spawn(async move {
                let mut c = client(addr, None).await;
                for j in 0..5 {
                    let id = i * 5 + j;
                    let rows = query(&mut c, &lookup(doc(id as i64 * 31))).await.unwrap();
                    assert_eq!(text(&rows), expected[id], "client {i}, lookup {j}");
                }
                // One client's error leaves the others alone.
                if i == 3 {
                    assert!(query(&mut c, "SELECT * FROM nowhere").await.is_err());
                }
            })
        })
        .collect();
    for handle in clients {
        bounded("a client", handle).await.unwrap();
    }
    server.stop().await.unwrap();
}

fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_returns_to_its_level_after_1000_statements() {
    let folders = folders();
    let (server, ctx) = start(&folders, None, limits()).await;
    let mut c = client(server.addr(), None).await;
    let one = |i: usize| {
        format!(
            "SELECT max(rank) FROM knn_join((SELECT * FROM docs WHERE doc_id = {}), docs, 'cosine', 10, 'device=cpu')",
            i % 4000
        )
    };
    // The first statements build and keep the index (its memory stays reserved in the pool
    // while the cache holds it); then the levels are taken.
    for i in 0..50 {
        query(&mut c, &one(i)).await.unwrap();
    }
    let kept = ctx.runtime_env().memory_pool.reserved();
    assert!(kept > 0, "the kept index is accounted in the pool");
    let before = resident_bytes();
    for i in 50..1050 {
        query(&mut c, &one(i * 7)).await.unwrap();
    }
    assert_eq!(ctx.runtime_env().memory_pool.reserved(), kept);
    let after = resident_bytes();
    // A statement's plan and batches are a few KB to a few MB; kept by every statement, 1,000
    // of them would be hundreds of MB.
    assert!(
        after < before + (96 << 20),
        "resident memory grew from {} MiB to {} MiB over 1,000 statements",
        before >> 20,
        after >> 20
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_serves_clients_that_trust_its_certificate() {
    let folders = folders();
    let dir = tempfile::tempdir().unwrap();
    // A CA, and the server's certificate signed by it (what --tls-ca trusts).
    let at = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(at("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            &at("ca.key"),
            "-out",
            &at("ca.pem"),
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &at("key.pem"),
            "-out",
            &at("req.csr"),
        ],
        &[
            "x509",
            "-req",
            "-in",
            &at("req.csr"),
            "-CA",
            &at("ca.pem"),
            "-CAkey",
            &at("ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &at("ext.cnf"),
            "-out",
            &at("cert.pem"),
        ],
    ];
    for step in steps {
        let made = Command::new("openssl")
            .args(step)
            .stderr(Stdio::null())
            .status()
            .expect("openssl makes the test's certificates");
        assert!(made.success(), "openssl {step:?}");
    }
    let (cert, key, ca) = (at("cert.pem"), at("key.pem"), at("ca.pem"));
    let roots = ReadRoots::new([&folders.root]).unwrap();
    let ctx = served_session(&roots, None).unwrap();
    let options = ServeOptions {
        bind: "127.0.0.1:0".parse().unwrap(),
        token: Token::new("tls-token").unwrap(),
        tls: Some((std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap())),
        limits: limits(),
    };
    let server = Server::start(ctx, options).await.unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap()))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{}", server.addr()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    c.set_token("tls-token".to_string());
    let rows = query(&mut c, "SELECT 40 + 2 AS answer").await.unwrap();
    assert!(text(&rows).contains("42"));
    // A plain-text client cannot talk to it.
    let plain = Endpoint::from_shared(format!("http://{}", server.addr()))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut c = FlightSqlServiceClient::new(channel);
        c.set_token("tls-token".to_string());
        assert!(bounded("a plain client", query(&mut c, "SELECT 1"))
            .await
            .is_err());
    }
    server.stop().await.unwrap();
}

// ---- the command line ------------------------------------------------------------------------

/// A `sparse-knn serve` process, killed when dropped (also when the test fails).
struct ServeProcess(Child);

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sparse-knn serve` on a free port and returns it with the URL it prints.
fn serve_process(args: &[&str], env: &[(&str, &str)]) -> (ServeProcess, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparse-knn"))
        .arg("serve")
        .args(["--bind", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let process = ServeProcess(child);
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.split("sparse-knn serve: listening on ").nth(1) {
                    let url = rest.split(';').next().unwrap().to_string();
                    // Keep reading its log so that the pipe never fills.
                    std::thread::spawn(move || for _ in rx {});
                    return (process, url);
                }
                seen.push(line);
            }
            Err(_) => panic!("sparse-knn serve did not start: {}", seen.join("\n")),
        }
    }
}

fn sql_client(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sparse-knn"))
        .arg("sql")
        .args(args)
        .env_remove("SPARSE_KNN_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn the_cli_serves_and_sql_server_is_its_client() {
    let folders = folders();
    let token_file = folders.root.parent().unwrap().join("token");
    std::fs::write(&token_file, "cli-token-123\n").unwrap();
    let table = format!("docs={}", folders.root.join("docs.parquet").display());
    let (_server, url) = serve_process(
        &[
            "--table",
            &table,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(url.starts_with("grpc://127.0.0.1:"), "{url}");
    let statement = "SELECT count(*) AS n FROM docs; SELECT neighbor_doc_id FROM knn_join((SELECT * FROM docs WHERE doc_id = 3), docs, 'cosine', 2) ORDER BY rank";
    let out = sql_client(
        &[
            "--server",
            &url,
            "--token-file",
            token_file.to_str().unwrap(),
            "--format",
            "csv",
            "-c",
            statement,
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = String::from_utf8(out.stdout).unwrap();
    let local = Command::new(env!("CARGO_BIN_EXE_sparse-knn"))
        .args(["sql", "--table", &table, "--format", "csv", "-c", statement])
        .output()
        .unwrap();
    assert!(
        local.status.success(),
        "{}",
        String::from_utf8_lossy(&local.stderr)
    );
    assert_eq!(served, String::from_utf8(local.stdout).unwrap());
    assert!(served.contains("4275"), "{served}");
    // The token from the environment works too; no token is refused, in one line.
    let out = sql_client(
        &["--server", &url, "-c", "SELECT 1"],
        &[("SPARSE_KNN_TOKEN", "cli-token-123")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sql_client(&["--server", &url, "-c", "SELECT 1"], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Unauthenticated"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn the_cli_refuses_to_serve_every_interface_without_a_token() {
    let out = Command::new(env!("CARGO_BIN_EXE_sparse-knn"))
        .args(["serve", "--bind", "0.0.0.0:0"])
        .env_remove("SPARSE_KNN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without a token"), "{err}");
}
