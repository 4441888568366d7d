//! The bytes of a capture: one pcapng section with one interface (the link
//! direction, raw IP), then an enhanced packet block per packet whose comment
//! carries what the emulated link did to it, and at the end a statistics block
//! with the packets the capture itself could not keep.

use super::link_tap::CapturedPacket;
use crate::sched::{PacketFate, TapVerdict};
use pcap_file::DataLink;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::interface_statistics::{
    InterfaceStatisticsBlock, InterfaceStatisticsOption,
};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use std::borrow::Cow;
use std::time::Duration;

/// Nanosecond timestamps (`if_tsresol` 9): the pipeline's clock is in ns.
const TS_RESOLUTION_NS: u8 = 9;
/// `epb_flags`: the packet was outbound on this interface.
const FLAG_OUTBOUND: u32 = 0b10;

#[derive(Debug, thiserror::Error)]
#[error("encoding pcapng: {0}")]
pub struct EncodeError(#[from] pcap_file::PcapError);

/// Writes blocks into a buffer the caller takes after each call, so a
/// capture streams as it goes.
pub struct Encoder {
    writer: PcapNgWriter<Vec<u8>>,
}

/// What the capture's interface is called and how much of each packet it keeps.
pub struct Interface<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub snaplen: u32,
}

impl Encoder {
    /// The section header and the link's interface.
    pub fn new(interface: &Interface<'_>) -> Result<Encoder, EncodeError> {
        let section = SectionHeaderBlock {
            options: vec![SectionHeaderOption::UserApplication(Cow::Owned(format!(
                "nextmini-agent {}",
                env!("CARGO_PKG_VERSION")
            )))],
            ..SectionHeaderBlock::default()
        };
        let mut writer = PcapNgWriter::with_section_header(Vec::new(), section)?;
        let idb = InterfaceDescriptionBlock {
            linktype: DataLink::RAW,
            snaplen: interface.snaplen,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(interface.name.to_string())),
                InterfaceDescriptionOption::IfDescription(Cow::Owned(
                    interface.description.to_string(),
                )),
                InterfaceDescriptionOption::IfTsResol(TS_RESOLUTION_NS),
            ],
        };
        writer.write_pcapng_block(idb)?;
        Ok(Encoder { writer })
    }

    /// Appends one packet.
    pub fn packet(&mut self, p: &CapturedPacket) -> Result<(), EncodeError> {
        let block = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(p.fate.timestamp_ns()),
            original_len: p.fate.len,
            data: Cow::Borrowed(&p.data),
            options: vec![
                EnhancedPacketOption::Flags(FLAG_OUTBOUND),
                EnhancedPacketOption::Comment(Cow::Owned(annotation(&p.fate))),
            ],
        };
        self.writer.write_pcapng_block(block)?;
        Ok(())
    }

    /// Appends the closing statistics: packets kept and packets the capture
    /// dropped because its reader fell behind.
    pub fn statistics(&mut self, now_ns: u64, kept: u64, missed: u64) -> Result<(), EncodeError> {
        let block = InterfaceStatisticsBlock {
            interface_id: 0,
            timestamp: now_ns,
            options: vec![
                InterfaceStatisticsOption::IsbIfRecv(kept + missed),
                InterfaceStatisticsOption::IsbIfDrop(missed),
                InterfaceStatisticsOption::Comment(Cow::Owned(format!(
                    "nextmini capture: {kept} packets kept, {missed} missed (the reader fell behind)"
                ))),
            ],
        };
        self.writer.write_pcapng_block(block)?;
        Ok(())
    }

    /// The bytes written since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.writer.get_mut())
    }
}

/// The packet's comment: `key=value` words, stable for scripts
/// (`tshark -T fields -e frame.comment`). Times are Unix seconds with
/// nanoseconds; depth is what the queue held when the packet arrived.
pub fn annotation(p: &PacketFate) -> String {
    use std::fmt::Write;
    let mut s = format!(
        "nextmini verdict={} queue={} depth_packets={} depth_bytes={} enqueued={}",
        p.verdict.label(),
        p.queue,
        p.depth_packets,
        p.depth_bytes,
        seconds(p.enqueued_ns),
    );
    if let Some(d) = p.departed_ns {
        let _ = write!(
            s,
            " departed={} sojourn_us={:.3}",
            seconds(d),
            d.saturating_sub(p.enqueued_ns) as f64 / 1e3
        );
    }
    if let Some(d) = p.delivered_ns {
        let _ = write!(s, " delivered={}", seconds(d));
    }
    if let TapVerdict::Sent {
        ecn_marked,
        corrupted,
        copies,
    } = p.verdict
    {
        if ecn_marked {
            s.push_str(" ecn=ce");
        }
        if corrupted {
            s.push_str(" corrupted=1");
        }
        if copies > 1 {
            let _ = write!(s, " copies={copies}");
        }
    }
    s
}

fn seconds(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}
