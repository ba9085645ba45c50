//! The kubelet's plugin watcher dials a plugin's registration socket by its path, and grpc-go then sends that path
//! as the HTTP/2 `:authority` (kubernetes/kubernetes#109081). `/var/lib/kubelet/plugins_registry/...` is not an
//! authority, and Rust's HTTP/2 server refuses such a request with PROTOCOL_ERROR, so the kubelet could never
//! register the driver. This front sits between the socket and the gRPC server: it passes every byte through but
//! the request header blocks, in which it replaces `:authority` with `localhost`.
//!
//! [`AuthorityRewriter`] is the pure part, fed the client's bytes as they come; [`Rewriting`] puts it in a
//! connection's reads, and [`serve`] is the I/O.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::Decoder;
use loona_hpack::encoder::encode_integer_into;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::server::Connected;
use tracing::debug;

/// The client connection preface of HTTP/2.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The length of an HTTP/2 frame header.
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// What replaces an authority that is a socket path, as grpc-go itself sends for `unix://` targets.
const AUTHORITY: &[u8] = b"localhost";

/// Why a client's bytes cannot be rewritten: the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The connection did not start with the HTTP/2 preface.
    #[error("not an HTTP/2 connection")]
    NoPreface,
    /// A frame is not what the HTTP/2 framing allows.
    #[error("malformed HTTP/2 frame: {0}")]
    Frame(&'static str),
    /// A header block cannot be decoded.
    #[error("cannot decode a header block: {0}")]
    Hpack(String),
}

/// Rewrites the `:authority` of every request a client sends on one connection.
#[derive(Default)]
pub struct AuthorityRewriter {
    /// The client's header compression state, which every block after the first depends on.
    decoder: Decoder<'static>,
    /// Bytes received but not yet a whole frame (or the whole preface).
    pending: Vec<u8>,
    preface_seen: bool,
    /// A header block still waiting for its CONTINUATION frames: stream, HEADERS flags, fragments so far.
    block: Option<(u32, u8, Vec<u8>)>,
}

impl std::fmt::Debug for AuthorityRewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityRewriter")
            .field("pending", &self.pending.len())
            .field("preface_seen", &self.preface_seen)
            .finish_non_exhaustive()
    }
}

impl AuthorityRewriter {
    /// Takes bytes from the client and returns the bytes to pass to the server.
    ///
    /// # Errors
    /// When the bytes are not HTTP/2 or a header block cannot be decoded.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, RewriteError> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        if !self.preface_seen {
            if self.pending.len() < PREFACE.len() {
                return if PREFACE.starts_with(&self.pending) {
                    Ok(out)
                } else {
                    Err(RewriteError::NoPreface)
                };
            }
            if !self.pending.starts_with(PREFACE) {
                return Err(RewriteError::NoPreface);
            }
            out.extend_from_slice(PREFACE);
            self.pending.drain(..PREFACE.len());
            self.preface_seen = true;
        }
        while self.pending.len() >= FRAME_HEADER {
            let length = usize::from(self.pending[0]) << 16
                | usize::from(self.pending[1]) << 8
                | usize::from(self.pending[2]);
            if self.pending.len() < FRAME_HEADER + length {
                break;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + length).collect();
            self.frame(&frame, &mut out)?;
        }
        Ok(out)
    }

    /// Passes one whole frame on, or collects it into a header block and passes the rewritten block on.
    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (kind, self.block.as_mut()) {
            (HEADERS, None) => {
                let fragment = headers_fragment(flags, payload)?;
                self.block = Some((stream, flags, fragment.to_vec()));
            }
            (CONTINUATION, Some((open, _, fragments))) if *open == stream => {
                fragments.extend_from_slice(payload);
            }
            (_, Some(_)) => return Err(RewriteError::Frame("a header block was interrupted")),
            _ => {
                out.extend_from_slice(frame);
                return Ok(());
            }
        }
        let ended = if kind == HEADERS { flags } else { frame[4] } & END_HEADERS != 0;
        if ended && let Some((stream, flags, fragments)) = self.block.take() {
            let block = self.rewrite(&fragments)?;
            write_headers(stream, flags & END_STREAM, &block, out)?;
        }
        Ok(())
    }

    /// Decodes a header block and encodes it again with `:authority` replaced, every field a literal that the
    /// server does not index (its compression state then never depends on ours).
    fn rewrite(&mut self, block: &[u8]) -> Result<Vec<u8>, RewriteError> {
        let headers = self
            .decoder
            .decode(block)
            .map_err(|error| RewriteError::Hpack(error.to_string()))?;
        let mut encoded = Vec::new();
        for (name, value) in headers {
            let value = if name == b":authority" {
                debug!(authority = %String::from_utf8_lossy(&value), "rewriting the kubelet's :authority");
                AUTHORITY.to_vec()
            } else {
                value
            };
            // Literal header field without indexing, new name (RFC 7541 §6.2.2), no Huffman coding.
            encoded.push(0);
            for text in [&name, &value] {
                encode_integer_into(text.len(), 7, 0, &mut encoded)
                    .map_err(|_| RewriteError::Frame("header too long"))?;
                encoded.extend_from_slice(text);
            }
        }
        Ok(encoded)
    }
}

/// The header block fragment of a HEADERS frame, without its padding and priority fields.
fn headers_fragment(flags: u8, payload: &[u8]) -> Result<&[u8], RewriteError> {
    let mut fragment = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&length, rest) = fragment
            .split_first()
            .ok_or(RewriteError::Frame("padded HEADERS without a pad length"))?;
        padding = usize::from(length);
        fragment = rest;
    }
    if flags & PRIORITY != 0 {
        fragment = fragment
            .get(5..)
            .ok_or(RewriteError::Frame("HEADERS too short for its priority"))?;
    }
    fragment
        .get(..fragment.len().saturating_sub(padding))
        .filter(|_| padding <= fragment.len())
        .ok_or(RewriteError::Frame("HEADERS padding longer than the frame"))
}

/// One HEADERS frame with the whole block (the server's frame size allows 16 KiB; requests are far smaller).
fn write_headers(
    stream: u32,
    end_stream: u8,
    block: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), RewriteError> {
    let length = u32::try_from(block.len())
        .ok()
        .filter(|length| *length <= 16_384)
        .ok_or(RewriteError::Frame("header block over 16 KiB"))?;
    out.extend_from_slice(&length.to_be_bytes()[1..]);
    out.extend_from_slice(&[HEADERS, END_HEADERS | end_stream]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(block);
    Ok(())
}

/// Serves `routes` on `listener`, every connection through an [`AuthorityRewriter`].
///
/// # Errors
/// When the gRPC server fails.
pub async fn serve(listener: UnixListener, routes: Routes) -> Result<(), tonic::transport::Error> {
    let connections =
        UnixListenerStream::new(listener).map(|accepted| accepted.map(Rewriting::new));
    tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming(connections)
        .await
}

/// A client connection whose bytes the server reads through an [`AuthorityRewriter`], and whose answers it writes
/// as they are. The server's own connection task does both: no task or buffer in between, so that a call costs no
/// more wake-ups than without the rewrite.
#[derive(Debug)]
pub struct Rewriting<S> {
    inner: S,
    rewriter: AuthorityRewriter,
    /// Rewritten bytes the server has not read yet.
    ready: Vec<u8>,
    /// How many of `ready` it has read.
    taken: usize,
}

impl<S> Rewriting<S> {
    /// `inner`, rewritten from its first byte.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: AuthorityRewriter::default(),
            ready: Vec::new(),
            taken: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewriting<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        // A read that gave the rewriter only part of a frame has nothing to hand on yet: read again, since an empty
        // answer would mean the end of the connection.
        while this.taken == this.ready.len() {
            let mut received = [0; 16 * 1024];
            let mut received = ReadBuf::new(&mut received);
            ready!(Pin::new(&mut this.inner).poll_read(context, &mut received))?;
            if received.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.ready = this
                .rewriter
                .feed(received.filled())
                .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
            this.taken = 0;
        }
        let count = buffer.remaining().min(this.ready.len() - this.taken);
        buffer.put_slice(&this.ready[this.taken..this.taken + count]);
        this.taken += count;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewriting<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(context)
    }
}

impl<S> Connected for Rewriting<S> {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use loona_hpack::Encoder;

    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut frame = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        frame.extend_from_slice(&[kind, flags]);
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    /// The headers of every HEADERS frame in `bytes` (after the preface), decoded as a server would.
    fn requests(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut decoder = Decoder::new();
        let mut rest = &bytes[PREFACE.len()..];
        let mut seen = Vec::new();
        while rest.len() >= FRAME_HEADER {
            let length =
                usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            if rest[3] == HEADERS {
                assert_ne!(rest[4] & END_HEADERS, 0);
                seen.push(
                    decoder
                        .decode(&rest[FRAME_HEADER..FRAME_HEADER + length])
                        .unwrap(),
                );
            }
            rest = &rest[FRAME_HEADER + length..];
        }
        seen
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_everything_else_passes() {
        let mut encoder = Encoder::new();
        let path = b"/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
        let request: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", path),
            (b"content-type", b"application/grpc"),
        ];
        let first = encoder.encode(request.iter().copied());
        // The second request's block refers to the first's through the client's dynamic table.
        let second = encoder.encode(request.iter().copied());
        let (head, tail) = second.split_at(second.len() / 2);
        let settings = frame(0x4, 0, 0, &[]);
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\0");
        let mut client = PREFACE.to_vec();
        client.extend(settings.clone());
        client.extend(frame(HEADERS, END_HEADERS, 1, &first));
        client.extend(data.clone());
        client.extend(frame(HEADERS, 0, 3, head));
        client.extend(frame(CONTINUATION, END_HEADERS, 3, tail));

        // Fed in small pieces, as a socket delivers them.
        let mut rewriter = AuthorityRewriter::default();
        let mut out = Vec::new();
        for piece in client.chunks(7) {
            out.extend(rewriter.feed(piece).unwrap());
        }
        let seen = requests(&out);
        assert_eq!(seen.len(), 2);
        for headers in &seen {
            let authority = headers
                .iter()
                .find(|(name, _)| name == b":authority")
                .unwrap();
            assert_eq!(authority.1, b"localhost");
            let path = headers.iter().find(|(name, _)| name == b":path").unwrap();
            assert_eq!(path.1, b"/pluginregistration.Registration/GetInfo");
        }
        let settings_at = PREFACE.len();
        assert_eq!(
            &out[settings_at..settings_at + settings.len()],
            settings.as_slice()
        );
        assert!(
            out.windows(data.len())
                .any(|window| window == data.as_slice())
        );
    }

    #[test]
    fn padding_and_priority_are_dropped_and_a_non_http2_client_is_refused() {
        let mut encoder = Encoder::new();
        let block = encoder.encode([(&b":authority"[..], &b"/x.sock"[..])]);
        let mut payload = vec![2];
        payload.extend_from_slice(&[0, 0, 0, 0, 16]);
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0, 0]);
        let mut client = PREFACE.to_vec();
        client.extend(frame(
            HEADERS,
            END_HEADERS | PADDED | PRIORITY | END_STREAM,
            5,
            &payload,
        ));
        let out = AuthorityRewriter::default().feed(&client).unwrap();
        let rewritten = &out[PREFACE.len()..];
        assert_eq!(rewritten[4], END_HEADERS | END_STREAM);
        assert_eq!(
            requests(&out)[0],
            [(b":authority".to_vec(), b"localhost".to_vec())]
        );

        let refused = AuthorityRewriter::default().feed(b"GET / HTTP/1.1\r\n\r\n");
        assert!(matches!(refused, Err(RewriteError::NoPreface)));
    }

    #[tokio::test]
    async fn a_connection_reads_rewritten_whatever_pieces_its_bytes_come_in_and_writes_as_is() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let mut encoder = Encoder::new();
        let block = encoder.encode([
            (
                &b":path"[..],
                &b"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"[..],
            ),
            (
                b":authority",
                b"/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock",
            ),
        ]);
        let mut sent = PREFACE.to_vec();
        sent.extend(frame(HEADERS, END_HEADERS, 1, &block));
        sent.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0"));
        let mut expected = AuthorityRewriter::default().feed(&sent).unwrap();

        let (mut client, server) = tokio::io::duplex(64);
        let mut connection = Rewriting::new(server);
        let writer = tokio::spawn(async move {
            // A piece that ends inside the preface, then one inside a frame header, then the rest.
            for piece in [
                &sent[..10],
                &sent[10..PREFACE.len() + 4],
                &sent[PREFACE.len() + 4..],
            ] {
                client.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
            let mut answer = [0; 5];
            client.read_exact(&mut answer).await.unwrap();
            answer
        });
        let mut read = vec![0; expected.len()];
        connection.read_exact(&mut read).await.unwrap();
        assert_eq!(read, expected);
        assert_eq!(requests(&read)[0][1].1, b"localhost");
        connection.write_all(b"hello").await.unwrap();
        assert_eq!(&writer.await.unwrap(), b"hello");
        expected.clear();
        assert_eq!(
            connection.read_to_end(&mut expected).await.unwrap(),
            0,
            "the client's end is the connection's end"
        );
    }
}
