//! Where a sans-serif font for plot labels lives: plotters' bitmap backend has none of its own,
//! and the benchmark suite and the soak both label their PNGs.

const SANS_SERIF: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// The first DejaVu Sans found where Debian, Fedora or Arch put it (Debian:
/// `apt install fonts-dejavu-core`).
pub fn sans_serif() -> Option<&'static str> {
    SANS_SERIF
        .iter()
        .copied()
        .find(|p| std::path::Path::new(p).exists())
}
