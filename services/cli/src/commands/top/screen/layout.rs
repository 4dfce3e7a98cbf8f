//! Where each part of `mgpu top`'s screen goes at a given size: the header, the two panes and
//! the status line. A leaf: the model asks it how many lines a page holds, the drawing where
//! to draw.

use ratatui::layout::Rect;

/// Where each part of the screen goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub header: Rect,
    pub nodes: Rect,
    pub jobs: Rect,
    pub status: Rect,
}

/// Header lines: the cluster's counts, then GPUs by model.
const HEADER: u16 = 2;

/// The screen of `size` (columns, rows) cut into parts. The nodes pane takes what its
/// `gpu_lines` need, up to a little over half of the space, so a small cluster leaves the
/// rest to the queue.
pub fn layout(size: (u16, u16), gpu_lines: usize) -> Layout {
    let (width, height) = size;
    let header = Rect::new(0, 0, width, HEADER.min(height));
    let status_height = u16::from(height > HEADER);
    let status = Rect::new(
        0,
        height.saturating_sub(status_height),
        width,
        status_height,
    );
    let body = height.saturating_sub(header.height + status_height);
    let wanted = u16::try_from(gpu_lines.saturating_add(2)).unwrap_or(u16::MAX);
    let most = u16::try_from(u32::from(body) * 11 / 20)
        .unwrap_or(body)
        .max(body.min(3));
    let nodes_height = wanted.min(most);
    let nodes = Rect::new(0, header.height, width, nodes_height);
    let jobs = Rect::new(0, header.height + nodes_height, width, body - nodes_height);
    Layout {
        header,
        nodes,
        jobs,
        status,
    }
}

/// Lines of a pane left for its rows (its title and column headings take two).
pub fn visible_lines(pane: Rect) -> usize {
    usize::from(pane.height.saturating_sub(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_gives_a_small_cluster_only_the_lines_it_needs() {
        let small = layout((120, 40), 2);
        assert_eq!(small.header.height, 2);
        assert_eq!(small.nodes.height, 4);
        assert_eq!(small.jobs.height, 40 - 2 - 4 - 1);
        assert_eq!(small.status.y, 39);
        let large = layout((120, 40), 8_000);
        assert_eq!(large.nodes.height, 37 * 11 / 20);
        // A terminal too small for anything still lays out without overflowing.
        let tiny = layout((10, 2), 100);
        assert_eq!(tiny.nodes.height + tiny.jobs.height, 0);
    }
}
