//! Writing an answer to a TLS connection (docs/TLS.md): through rustls, which encrypts it,
//! rather than to the socket; files are read and encrypted in records instead of going out
//! with sendfile(2). A client that takes nothing for `--send-timeout` is cut, as in `write.rs`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::timeout;

use crate::client::peer::ClientStream;

/// A file's bytes are encrypted this many at a time: one TLS record's worth.
const FILE_CHUNK: usize = 16 * 1024;

/// Writes all of `data` through the stream, then sends what rustls holds of it. Each write
/// returns once rustls has taken some of it, which it does as soon as the socket has taken
/// records: progress, so `limit` (--send-timeout) counts from the last.
pub(in crate::client) async fn send<S: ClientStream>(
    stream: &mut S,
    mut data: &[u8],
    limit: Duration,
) -> io::Result<()> {
    while !data.is_empty() {
        let taken = timeout(limit, stream.write(data)).await.map_err(|_| stalled(limit))??;
        data = &data[taken..];
    }
    timeout(limit, stream.flush()).await.map_err(|_| stalled(limit))?
}

/// Reads `count` bytes of `file` from `offset` and writes them through the stream.
pub(in crate::client) async fn send_file<S: ClientStream>(
    stream: &mut S,
    file: &File,
    mut offset: u64,
    mut count: u64,
    limit: Duration,
) -> io::Result<()> {
    let mut chunk = vec![0u8; FILE_CHUNK.min(count as usize)];
    while count > 0 {
        let want = chunk.len().min(count as usize);
        let read = file.read_at(&mut chunk[..want], offset)?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file is shorter than announced"));
        }
        send(stream, &chunk[..read], limit).await?;
        offset += read as u64;
        count -= read as u64;
    }
    Ok(())
}

fn stalled(limit: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the client took no byte of its answer for {} s (--send-timeout)", limit.as_secs_f64()),
    )
}
