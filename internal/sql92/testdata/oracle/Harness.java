// Harness evaluates selectors with RocketMQ's own filter module, for TestOracle.
//
// Build it against the rocketmq-filter jar of the RocketMQ release to compare with (and
// the Guava jar it needs):
//
//	javac -cp rocketmq-filter.jar:guava.jar -d out Harness.java
//	FLOWD_SQL92_ORACLE="java -cp out:rocketmq-filter.jar:guava.jar Harness" \
//	    go test -run TestOracle ./internal/sql92/
//
// Input, one case a line: the expression, then property keys and values, each hex-encoded
// UTF-8, separated by spaces. Output, one line a case: ERR when the selector does not
// compile, otherwise T or F as a RocketMQ broker would decide (an evaluation exception or a
// non-TRUE result leaves the message out).

import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import org.apache.rocketmq.filter.expression.EvaluationContext;
import org.apache.rocketmq.filter.expression.Expression;
import org.apache.rocketmq.filter.parser.SelectorParser;

public class Harness {
    static String unhex(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int i = 0; i < b.length; i++) {
            b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        }
        return new String(b, StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new BufferedOutputStream(System.out), false, "UTF-8");
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(" ", -1);
            final Map<String, String> props = new HashMap<>();
            for (int i = 1; i + 1 < f.length; i += 2) {
                props.put(unhex(f[i]), unhex(f[i + 1]));
            }
            Expression e;
            try {
                e = SelectorParser.parse(unhex(f[0]));
            } catch (Throwable t) {
                out.println("ERR");
                continue;
            }
            Object ret = null;
            try {
                ret = e.evaluate(new EvaluationContext() {
                    public Object get(String name) {
                        return props.get(name);
                    }

                    public Map<String, Object> keyValues() {
                        return new HashMap<>(props);
                    }
                });
            } catch (Throwable t) {
                // the broker logs it and leaves the message out
            }
            out.println(Boolean.TRUE.equals(ret) ? "T" : "F");
        }
        out.flush();
    }
}
