fn main() {
    println!("belfry: under construction");
}
