//! Keeps the kernel's IPv6 off the TUN device without a sysctl: the device
//! gets `addrgenmode none` over netlink before it comes up, so it has no
//! link-local address and sends no router solicitations, DAD probes or MLD
//! reports into the dataplane (which carries IPv4 only).
//!
//! Not `disable_ipv6`: every sysctl written in a namespace costs a lookup that
//! grows with the number of namespaces on the machine (one kernel hash chain
//! holds every namespace's `/proc/sys/net`), which at thousands of nodes was a
//! tenth of the machine's CPU while they started.

use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, LinkAttribute, LinkMessage,
};
use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use std::io;

/// Sets `addrgenmode none` on interface `index` of the calling thread's
/// namespace and waits for the kernel's answer.
pub fn no_addresses(index: u32) -> io::Result<()> {
    let mut link = LinkMessage::default();
    link.header.index = index;
    link.attributes
        .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
            vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
        )]));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut request = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::SetLink(link)),
    );
    request.finalize();
    let mut bytes = vec![0u8; request.buffer_len()];
    request.serialize(&mut bytes);

    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.send(&bytes, 0)?;
    let (reply, _) = socket.recv_from_full()?;
    let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match answer.payload {
        NetlinkPayload::Error(e) if e.code.is_some() => Err(e.to_io()),
        _ => Ok(()),
    }
}
