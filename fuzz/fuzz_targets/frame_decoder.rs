//! Link frames from a peer: `frame::decode`, the `FrameCodec` decoder fed the
//! same bytes in different chunkings, and `LinkHello::decode`.
//!
//! Invariants: decode never claims more bytes than it was given; a decoded frame
//! re-encodes to exactly the bytes it came from; every prefix of a frame asks for
//! more bytes; an error stays an error when more bytes arrive; the decoder's
//! frames and its verdict do not depend on how the stream was cut; a decoded
//! hello re-encodes to the bytes it was read from.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use nextmini_agent::frame::{
    self, Frame, FrameCodec, FrameKind, HEADER_LEN, LinkHello, MAX_HELLO_FIELD, MAX_PAYLOAD,
};
use nextmini_fuzz::Rng;
use tokio_util::codec::{Decoder, Encoder};

/// Longest input also decoded one byte at a time.
const BYTEWISE_MAX: usize = 256;

fuzz_target!(|data: &[u8]| {
    check_decode(data);
    check_codec(data);
    check_hello(data);
});

fn check_decode(data: &[u8]) {
    match frame::decode(data) {
        Ok(Some((header, total))) => {
            assert!(total <= data.len(), "{total} > {}", data.len());
            assert_eq!(total, HEADER_LEN + header.payload_len as usize);
            assert!(header.payload_len as usize <= MAX_PAYLOAD);
            let mut encoded = Vec::new();
            frame::encode_header(&header, &mut encoded);
            assert_eq!(&encoded[..], &data[..HEADER_LEN], "header re-encodes");
            // Nothing after the frame matters, and every shorter prefix needs more.
            assert_eq!(
                frame::decode(&data[..total]).ok().flatten(),
                Some((header, total))
            );
            for cut in prefixes(total) {
                assert!(
                    matches!(frame::decode(&data[..cut]), Ok(None)),
                    "prefix of {cut} bytes of a {total}-byte frame"
                );
            }
        }
        Ok(None) => {
            for cut in prefixes(data.len()) {
                assert!(matches!(frame::decode(&data[..cut]), Ok(None)));
            }
        }
        Err(e) => {
            // Errors are found as soon as their bytes are there; more bytes
            // cannot make them go away or change.
            let mut longer = data.to_vec();
            longer.extend_from_slice(&[0xa5; 16]);
            let again = frame::decode(&longer).expect_err("still an error");
            assert_eq!(e.to_string(), again.to_string());
        }
    }
}

/// Lengths of the proper prefixes of `len` bytes worth checking: decode reads
/// only the header, so every length past it behaves like the one before `len`.
fn prefixes(len: usize) -> impl Iterator<Item = usize> {
    (0..len.min(HEADER_LEN + 2)).chain(len.checked_sub(1).filter(|&l| l >= HEADER_LEN + 2))
}

/// What the decoder made of a whole stream.
#[derive(Debug, PartialEq)]
struct Outcome {
    frames: Vec<Frame>,
    /// The error that ended the stream, or `None` when the input ran out first.
    error: Option<String>,
    /// Bytes left undecoded when the input ran out.
    rest: Vec<u8>,
}

fn decode_stream(data: &[u8], mut next_chunk: impl FnMut() -> usize) -> Outcome {
    let mut codec = FrameCodec;
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let n = next_chunk().clamp(1, data.len() - pos);
        buf.extend_from_slice(&data[pos..pos + n]);
        pos += n;
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(e) => {
                    return Outcome {
                        frames,
                        error: Some(e.to_string()),
                        rest: Vec::new(),
                    };
                }
            }
        }
    }
    // End of stream: leftover bytes are an error, none is a clean end.
    let at_eof = codec.decode_eof(&mut buf);
    match at_eof {
        Ok(None) => assert!(buf.is_empty()),
        Ok(Some(_)) => panic!("decode_eof found a frame decode missed"),
        Err(_) => assert!(!buf.is_empty()),
    }
    Outcome {
        frames,
        error: None,
        rest: buf.to_vec(),
    }
}

fn check_codec(data: &[u8]) {
    let whole = decode_stream(data, || usize::MAX);

    // The frames re-encode to exactly the bytes they were decoded from.
    let mut encoded = BytesMut::new();
    for f in &whole.frames {
        assert_eq!(f.header.payload_len as usize, f.payload.len());
        FrameCodec
            .encode(f.clone(), &mut encoded)
            .expect("a decoded frame encodes");
        if f.header.kind == FrameKind::Hello {
            check_hello(&f.payload);
        }
    }
    assert_eq!(&encoded[..], &data[..encoded.len()]);
    if whole.error.is_none() {
        assert_eq!(&data[encoded.len()..], &whole.rest[..]);
    }

    // The same stream in other pieces: one byte at a time (short inputs only:
    // it costs a decode call per byte), in small pieces around header sizes,
    // and in larger random pieces.
    if data.len() <= BYTEWISE_MAX {
        let bytewise = decode_stream(data, || 1);
        assert_eq!(bytewise, whole, "one byte at a time");
    }
    let mut rng = Rng::from_bytes(data);
    let small = decode_stream(data, || match rng.below(8) {
        0..=2 => 1 + rng.below(3) as usize,
        3..=5 => HEADER_LEN - 2 + rng.below(5) as usize,
        _ => 1 + rng.below(64) as usize,
    });
    assert_eq!(small, whole, "small pieces");
    let large = decode_stream(data, || 1 + rng.below(1_500) as usize);
    assert_eq!(large, whole, "large pieces");
}

fn check_hello(data: &[u8]) {
    let Ok(hello) = LinkHello::decode(data) else {
        return;
    };
    let encoded = hello.encode();
    assert!(
        data.starts_with(&encoded),
        "hello re-encodes to the bytes it came from"
    );
    for field in [&hello.topology, &hello.link, &hello.node] {
        assert!(field.len() <= MAX_HELLO_FIELD);
    }
    let rebuilt = LinkHello::new(
        hello.topology.clone(),
        hello.link.clone(),
        hello.node.clone(),
    )
    .expect("decoded fields are within limits");
    assert_eq!(rebuilt, hello);
    assert_eq!(LinkHello::decode(&encoded).expect("round trip"), hello);
    // As the first frame on a link, it round-trips too.
    let frame = Frame::new(FrameKind::Hello, 0, Bytes::from(encoded.to_vec()));
    let mut wire = BytesMut::new();
    FrameCodec.encode(frame.clone(), &mut wire).expect("fits");
    assert_eq!(FrameCodec.decode(&mut wire).expect("valid"), Some(frame));
}
