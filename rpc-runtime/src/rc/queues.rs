//! Queue setup shared by the RC transports: RC QPs that take their
//! receives from a shared SRQ of zero-length WQEs, and the refill of that SRQ.

use mlx5::verbs::{Context, Cq, Pd, Qp, QpCaps, QpInit, QpType, Srq};

/// Creates an RC QP (in RESET) on `send_cq`/`recv_cq` whose receives come from `srq`, with
/// `max_send_wr` send WQEs of one data segment and up to `max_inline` inline bytes.
///
/// # Errors
/// The device's error.
pub(crate) fn rc_qp_on_srq(
    device: &Context,
    pd: &Pd,
    send_cq: &Cq,
    recv_cq: &Cq,
    srq: &Srq,
    max_send_wr: u32,
    max_inline: u32,
) -> mlx5::Result<Qp> {
    device.create_qp(
        pd,
        &QpInit {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq,
            srq: Some(srq),
            caps: QpCaps {
                max_send_wr,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: max_inline,
            },
        },
    )
}

/// Creates an SRQ of `max_wr` zero-length receive WQEs, all posted.
///
/// # Errors
/// The device's error.
pub(crate) fn zero_length_srq(device: &Context, pd: &Pd, max_wr: u32) -> mlx5::Result<Srq> {
    let mut srq = device.create_srq(pd, max_wr, 1)?;
    srq.srq.fill_empty();
    Ok(srq)
}

/// Refills `srq` in one doorbell once fewer than 2/3 of its capacity are posted (seeds/001
/// "poll()の6ステップ" step 3: batched reposting).
#[inline]
pub(crate) fn refill_srq(srq: &mut Srq) {
    if srq.srq.posted() < srq.srq.capacity() * 2 / 3 {
        srq.srq.fill_empty();
    }
}
