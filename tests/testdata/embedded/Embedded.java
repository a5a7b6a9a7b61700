// A JVM that loads libpython, as Jep does: the main thread runs Python code through JNI
// (embedded.c) while another thread runs Java half the time (the two use a core and a half of
// the two here, and leave the profiler room). Its arguments: the JNI library, seconds.
public class Embedded {
    static native void runPython(String code);

    static volatile long sink;

    static long javaSpin(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) {
            x += i * 31 ^ x;
        }
        return x;
    }

    public static void main(String[] args) throws Exception {
        System.load(args[0]);
        double seconds = Double.parseDouble(args[1]);
        long end = System.nanoTime() + (long) (seconds * 1e9);
        Thread java = new Thread(() -> {
            try {
                while (System.nanoTime() < end) {
                    long slice = System.nanoTime() + 10_000_000;
                    while (System.nanoTime() < slice) {
                        sink += javaSpin(10_000);
                    }
                    Thread.sleep(10);
                }
            } catch (InterruptedException stop) {
                return;
            }
        }, "java-spin");
        java.start();
        runPython("import time\n"
                  + "def python_spin(seconds):\n"
                  + "    end = time.time() + seconds\n"
                  + "    x = 0\n"
                  + "    while time.time() < end:\n"
                  + "        for i in range(10000):\n"
                  + "            x += i * i\n"
                  + "    return x\n"
                  + "python_spin(" + seconds + ")\n");
        java.join();
    }
}
