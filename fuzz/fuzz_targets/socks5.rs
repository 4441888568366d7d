//! What a SOCKS5 client or a neighbour's max-mode relay sends an agent:
//! `socks::handshake::{parse_greeting, parse_credentials, parse_request}` and
//! `maxmode::header::MaxHeader::{decode_body, open}`.
//!
//! Invariants: a parser never claims more bytes than it was given; every proper
//! prefix of a complete message asks for more bytes, and an error stays the same
//! error when more bytes arrive; a parsed request re-encodes to exactly the bytes
//! it came from; the messages parse the same way one after another, as the server
//! reads them (greeting, credentials, request), as they do alone; a decoded header
//! re-encodes to its bytes, and no header opens without the right tag.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nextmini_agent::link_auth::LinkKey;
use nextmini_agent::maxmode::header::{BODY_LEN, HEADER_LEN, MaxHeader};
use nextmini_agent::socks::handshake::{
    self, ParseError, encode_request, parse_credentials, parse_greeting, parse_request,
};

type Parsed<T> = Result<Option<(T, usize)>, ParseError>;

fuzz_target!(|data: &[u8]| {
    check(data, parse_greeting);
    check(data, parse_credentials);
    check(data, parse_request);
    if let Ok(Some((request, used))) = parse_request(data) {
        let bytes = encode_request(&request).expect("a parsed name fits in 255 bytes");
        assert_eq!(bytes, &data[..used], "request re-encodes to its bytes");
        // The reply for any code and a v4 or v6 address has a fixed shape.
        let reply = handshake::reply(
            handshake::Reply::from_code(data[0]),
            "0.0.0.0:0".parse().expect("addr"),
        );
        assert_eq!(reply.len(), 10);
    }
    check_sequence(data);
    check_header(data);
});

/// The parser's own invariants on `data` and its prefixes.
fn check<T: PartialEq + std::fmt::Debug>(data: &[u8], parse: fn(&[u8]) -> Parsed<T>) {
    let whole = parse(data);
    assert_eq!(parse(data), whole, "deterministic");
    match &whole {
        Ok(Some((_, used))) => {
            assert!(
                *used > 0 && *used <= data.len(),
                "used {used} of {}",
                data.len()
            );
            // The message ends at `used`: what follows changes nothing.
            assert_eq!(parse(&data[..*used]), whole);
            for cut in 0..*used {
                assert_eq!(parse(&data[..cut]), Ok(None), "prefix of {cut} bytes");
            }
        }
        Ok(None) => {
            for cut in 0..data.len() {
                assert_eq!(parse(&data[..cut]), Ok(None), "prefix of {cut} bytes");
            }
        }
        Err(e) => {
            // More bytes never fix a broken message.
            let mut longer = data.to_vec();
            longer.extend_from_slice(&[0u8; 300]);
            assert_eq!(parse(&longer).as_ref().err(), Some(e));
        }
    }
}

/// Greeting, credentials and request back to back, as one connection sends them.
fn check_sequence(data: &[u8]) {
    let mut rest = data;
    let Ok(Some((_, used))) = parse_greeting(rest) else {
        return;
    };
    rest = &rest[used..];
    if let Ok(Some((_, used))) = parse_credentials(rest) {
        rest = &rest[used..];
    }
    if let Ok(Some((request, used))) = parse_request(rest) {
        assert_eq!(parse_request(&rest[..used]), Ok(Some((request, used))));
    }
}

fn check_header(data: &[u8]) {
    let key = LinkKey::from_identity(b"fuzz topology").expect("key");
    match MaxHeader::decode_body(data) {
        Ok(h) => {
            assert!(data.len() >= BODY_LEN);
            assert_eq!(
                h.encode_body(),
                data[..BODY_LEN],
                "header re-encodes to its bytes"
            );
            let sealed = h.seal(&key, 1_000_000);
            assert_eq!(MaxHeader::open(&sealed, &key, 1_000_000), Ok(h));
        }
        Err(_) => assert!(MaxHeader::open(data, &key, 1_000_000).is_err()),
    }
    // Arbitrary bytes never carry a valid tag (unless they are a sealed header).
    if data.len() == HEADER_LEN {
        let opened = MaxHeader::open(data, &key, 1_000_000);
        if let Ok(h) = opened {
            assert_eq!(
                h.seal(
                    &key,
                    u64::from_be_bytes(data[BODY_LEN..BODY_LEN + 8].try_into().expect("8 bytes"))
                ),
                data
            );
        }
    }
}
