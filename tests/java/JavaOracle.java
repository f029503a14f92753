// Test oracle: the real JDK's HashMap and String.hashCode, for rmqlake's tests.
//
// Reads one request per line on stdin, writes one answer per line:
//   props <name-hex>:<value-hex> ...   -> hex of the properties string a broker writes after
//                                         putting the pairs, in order, into new HashMap<>(128)
//                                         (MessageDecoder.messageProperties2String's layout)
//   hash <text-hex>                    -> String.hashCode of the UTF-8 decoded text
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

public class JavaOracle {
    static String decode(String hex) {
        byte[] out = new byte[hex.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(hex.substring(2 * i, 2 * i + 2), 16);
        }
        return new String(out, StandardCharsets.UTF_8);
    }

    static String encode(String text) {
        StringBuilder sb = new StringBuilder();
        for (byte b : text.getBytes(StandardCharsets.UTF_8)) {
            sb.append(String.format("%02x", b));
        }
        return sb.toString();
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, true, "UTF-8");
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.split(" ");
            if (parts[0].equals("props")) {
                Map<String, String> map = new HashMap<>(128);
                for (int i = 1; i < parts.length; i++) {
                    String[] kv = parts[i].split(":", -1);
                    map.put(decode(kv[0]), decode(kv[1]));
                }
                StringBuilder sb = new StringBuilder();
                for (Map.Entry<String, String> e : map.entrySet()) {
                    sb.append(e.getKey()).append('\u0001').append(e.getValue()).append('\u0002');
                }
                out.println(encode(sb.toString()));
            } else if (parts[0].equals("hash")) {
                out.println(decode(parts.length > 1 ? parts[1] : "").hashCode());
            } else {
                out.println("error unknown request " + parts[0]);
            }
        }
    }
}
