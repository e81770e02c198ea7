//! What every object this crate builds carries, written once: the license
//! the kernel checks before it lets a program call GPL-only helpers, and
//! the panic handler a `no_std` binary must have (never run: a panic left
//! in a program would be this endless loop, which the verifier refuses).

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
