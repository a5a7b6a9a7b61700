/** Two busy threads whose time is mostly at the edges of small compiled methods: "shapes" calls
 *  tiny methods through an interface with five implementations (a megamorphic call: a vtable stub,
 *  then each method's prologue and epilogue around a few instructions of work), "recursion" a
 *  recursive method that C2 compiles without inlining itself away. Each runs for the seconds
 *  given; the main thread only waits. */
public class Edges {
    interface Shape { double area(); }
    static final class Square implements Shape { final double s; Square(double s) { this.s = s; } public double area() { return s * s; } }
    static final class Circle implements Shape { final double r; Circle(double r) { this.r = r; } public double area() { return 3.14159 * r * r; } }
    static final class Triangle implements Shape { final double b, h; Triangle(double b, double h) { this.b = b; this.h = h; } public double area() { return b * h / 2; } }
    static final class Rectangle implements Shape { final double w, h; Rectangle(double w, double h) { this.w = w; this.h = h; } public double area() { return w * h; } }
    static final class Hexagon implements Shape { final double s; Hexagon(double s) { this.s = s; } public double area() { return 2.598 * s * s; } }

    static volatile double sink;

    static double areas(Shape[] shapes, int n) {
        double total = 0;
        for (int i = 0; i < n; i++) total += shapes[(i * 7) % shapes.length].area();
        return total;
    }

    static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

    public static void main(String[] args) throws Exception {
        long deadline = System.nanoTime() + (long) (Double.parseDouble(args[0]) * 1e9);
        Shape[] shapes = { new Square(2), new Circle(1), new Triangle(2, 3), new Rectangle(1, 2), new Hexagon(1) };
        Thread a = new Thread(() -> { while (System.nanoTime() < deadline) sink += areas(shapes, 100000); }, "shapes");
        Thread b = new Thread(() -> { while (System.nanoTime() < deadline) sink += fib(24); }, "recursion");
        a.start();
        b.start();
        a.join();
        b.join();
    }
}
