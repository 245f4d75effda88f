//! `sparse-knn sql --server grpc://HOST:PORT`: statements run by a `sparse-knn serve` server,
//! printed as a local run prints them.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow_flight::sql::client::{FlightSqlServiceClient, PreparedStatement};
use datafusion::sql::parser::DFParser;
use futures::TryStreamExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::sql::Printer;
use super::{CliError, CliResult};

/// A connection to a server, with the token every call carries.
pub struct Remote {
    client: FlightSqlServiceClient<tonic::transport::Channel>,
    url: String,
}

impl Remote {
    /// Connects to `url` (`grpc://HOST:PORT`, or `grpc+tls://HOST:PORT` trusting `tls_ca`).
    pub async fn connect(
        url: &str,
        token: Option<String>,
        tls_ca: Option<&Path>,
    ) -> CliResult<Self> {
        let (address, tls) = if let Some(rest) = url.strip_prefix("grpc://") {
            (format!("http://{rest}"), false)
        } else if let Some(rest) = url.strip_prefix("grpc+tls://") {
            (format!("https://{rest}"), true)
        } else {
            cli_bail!("--server '{url}': expected grpc://HOST:PORT or grpc+tls://HOST:PORT");
        };
        let mut endpoint = Endpoint::from_shared(address)
            .map_err(|e| CliError(format!("--server '{url}': {e}")))?;
        if tls {
            let mut config = ClientTlsConfig::new();
            match tls_ca {
                Some(ca) => {
                    let pem = std::fs::read(ca)
                        .map_err(|e| CliError(format!("--tls-ca {}: {e}", ca.display())))?;
                    config = config.ca_certificate(Certificate::from_pem(pem));
                }
                None => cli_bail!("--server '{url}': give the CA certificate that signed the server's with --tls-ca"),
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| CliError(format!("--server '{url}': TLS: {e}")))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| CliError(format!("cannot reach {url}: {}", source_chain(&e))))?;
        let mut client = FlightSqlServiceClient::new(channel);
        if let Some(token) = token {
            client.set_token(token);
        }
        Ok(Self {
            client,
            url: url.to_string(),
        })
    }

    /// Runs one statement; its schema and rows.
    pub async fn query(
        &mut self,
        sql: &str,
    ) -> CliResult<(SchemaRef, Vec<arrow::record_batch::RecordBatch>)> {
        let info = self
            .client
            .execute(sql.to_string(), None)
            .await
            .map_err(failed(&self.url))?;
        self.rows_of(info).await
    }

    /// Prepares `sql` on the server (once; run it with [`Remote::run_prepared`]).
    pub async fn prepare(&mut self, sql: &str) -> CliResult<PreparedStatement<Channel>> {
        self.client
            .prepare(sql.to_string(), None)
            .await
            .map_err(failed(&self.url))
    }

    /// Runs a prepared statement with `values` bound to its parameters (a column each, one row).
    pub async fn run_prepared(
        &mut self,
        statement: &mut PreparedStatement<Channel>,
        values: arrow::record_batch::RecordBatch,
    ) -> CliResult<(SchemaRef, Vec<arrow::record_batch::RecordBatch>)> {
        statement
            .set_parameters(values)
            .map_err(failed(&self.url))?;
        let info = statement.execute().await.map_err(failed(&self.url))?;
        self.rows_of(info).await
    }

    /// The schema and rows of a statement's endpoints.
    async fn rows_of(
        &mut self,
        info: arrow_flight::FlightInfo,
    ) -> CliResult<(SchemaRef, Vec<arrow::record_batch::RecordBatch>)> {
        let schema: SchemaRef = Arc::new(
            info.clone()
                .try_decode_schema()
                .map_err(|e| CliError(format!("{}: the result's schema: {e}", self.url)))?,
        );
        let mut batches = Vec::new();
        for endpoint in info.endpoint {
            let Some(ticket) = endpoint.ticket else {
                continue;
            };
            let stream = self
                .client
                .do_get(ticket)
                .await
                .map_err(failed(&self.url))?;
            let mut part: Vec<_> = stream.try_collect().await.map_err(failed(&self.url))?;
            batches.append(&mut part);
        }
        Ok((schema, batches))
    }
}

/// A failed call to the server at `url` as the CLI's error.
fn failed(url: &str) -> impl Fn(arrow_flight::error::FlightError) -> CliError + '_ {
    move |e| CliError(format!("{url}: {}", flight_message(e)))
}

/// The server's own message where there is one (a refused token, a path outside the roots).
fn flight_message(e: arrow_flight::error::FlightError) -> String {
    match e {
        arrow_flight::error::FlightError::Tonic(status) => {
            format!("{:?}: {}", status.code(), status.message())
        }
        other => other.to_string(),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Runs every statement of `text` on the server in order, printing the results of those that
/// return rows.
pub async fn run_script(remote: &mut Remote, text: &str, printer: &mut Printer) -> CliResult<()> {
    // Split here (the server takes one statement a call), in DataFusion's dialect.
    let statements = DFParser::parse_sql(text)?;
    for statement in statements {
        let started = Instant::now();
        let (schema, batches) = remote.query(&statement.to_string()).await?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        printer.statement_done(started, rows as u64);
        if !schema.fields().is_empty() {
            printer.print_all(&schema, &batches)?;
        }
    }
    Ok(())
}
