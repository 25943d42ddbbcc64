use occl::{Comm, RedOp};
fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let count: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let comms = Comm::init_all(n).expect("init");
    let hs: Vec<_> = comms.into_iter().map(|c| std::thread::spawn(move || {
        let send: Vec<f32> = (0..count).map(|i| (c.rank() + i % 7) as f32).collect();
        let mut recv = vec![0f32; count];
        c.all_reduce(&send, &mut recv, RedOp::Sum).expect("ar");
        for i in 0..count { let want: f32 = (0..c.nranks()).map(|r| (r + i%7) as f32).sum(); assert_eq!(recv[i], want, "i={i}"); }
        let mut ag = vec![0f32; count * c.nranks()];
        c.all_gather(&send, &mut ag).expect("ag");
        let t = std::time::Instant::now();
        for _ in 0..100 { c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap(); }
        if c.rank()==0 { println!("{} us/op", t.elapsed().as_secs_f64()*1e6/100.0); }
        c.destroy().unwrap();
    })).collect();
    for h in hs { h.join().unwrap(); }
    println!("ok");
}
