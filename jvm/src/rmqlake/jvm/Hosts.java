package rmqlake.jvm;

/**
 * Host texts ({@code a.b.c.d:port}, {@code [v6]:port}) in the forms the per-line parser accepts without doubt,
 * as the bytes a record holds and the canonical text the tables hold.
 *
 * <p>Only plain forms are taken: dotted quads without leading zeros, IPv6 as hex groups with at most one
 * {@code ::} (no embedded IPv4, no zone). Every other text gives {@code null}, and its line goes to the
 * per-line parser, which accepts or refuses it with its reason.
 */
final class Hosts {
    private Hosts() {}

    /** A parsed host: the record's address bytes (4 or 16) and port, its canonical text and offsetMsgId prefix. */
    static final class Host {
        final byte[] address;
        final int port;
        final String text;
        final String msgIdPrefix;

        Host(byte[] address, int port) {
            this.address = address;
            this.port = port;
            this.text = address.length == 16 ? "[" + compressed(address) + "]:" + port : dotted(address) + ":" + port;
            byte[] field = new byte[address.length + 4];
            System.arraycopy(address, 0, field, 0, address.length);
            field[address.length] = (byte) (port >>> 24);
            field[address.length + 1] = (byte) (port >>> 16);
            field[address.length + 2] = (byte) (port >>> 8);
            field[address.length + 3] = (byte) port;
            this.msgIdPrefix = Hex.upper(field);
        }

        boolean isIpv6() {
            return address.length == 16;
        }
    }

    /** The host of {@code text}, or {@code null} when it is not in a plain form (or not a host at all). */
    static Host parse(String text) {
        if (text.isEmpty()) {
            return null;
        }
        String addressText;
        String portText;
        if (text.charAt(0) == '[') {
            int close = text.indexOf(']');
            if (close < 0 || close + 1 >= text.length() || text.charAt(close + 1) != ':') {
                return null;
            }
            addressText = text.substring(1, close);
            portText = text.substring(close + 2);
        } else {
            int colon = text.lastIndexOf(':');
            if (colon < 0) {
                return null;
            }
            addressText = text.substring(0, colon);
            portText = text.substring(colon + 1);
            if (addressText.indexOf(':') >= 0) {
                return null;
            }
        }
        if (portText.isEmpty() || portText.length() > 5) {
            return null;
        }
        int port = 0;
        for (int i = 0; i < portText.length(); i++) {
            char c = portText.charAt(i);
            if (c < '0' || c > '9') {
                return null;
            }
            port = port * 10 + (c - '0');
        }
        if (port > 65535) {
            return null;
        }
        byte[] address = text.charAt(0) == '[' ? ipv6(addressText) : ipv4(addressText);
        if (address == null) {
            return null;
        }
        if (address.length == 16 && isIpv4Mapped(address)) {
            // an IPv4-mapped address is an Inet4Address in Java: 4 bytes, no IPv6 flag
            byte[] four = new byte[4];
            System.arraycopy(address, 12, four, 0, 4);
            address = four;
        }
        return new Host(address, port);
    }

    private static byte[] ipv4(String text) {
        byte[] out = new byte[4];
        int part = 0;
        int start = 0;
        for (int i = 0; i <= text.length(); i++) {
            if (i == text.length() || text.charAt(i) == '.') {
                int length = i - start;
                if (part > 3 || length < 1 || length > 3 || (length > 1 && text.charAt(start) == '0')) {
                    return null;
                }
                int value = 0;
                for (int j = start; j < i; j++) {
                    char c = text.charAt(j);
                    if (c < '0' || c > '9') {
                        return null;
                    }
                    value = value * 10 + (c - '0');
                }
                if (value > 255) {
                    return null;
                }
                out[part++] = (byte) value;
                start = i + 1;
            }
        }
        return part == 4 ? out : null;
    }

    private static byte[] ipv6(String text) {
        int gap = text.indexOf("::");
        if (gap >= 0 && text.indexOf("::", gap + 1) >= 0) {
            return null;
        }
        int[] head = gap < 0 ? groups(text) : groups(text.substring(0, gap));
        int[] tail = gap < 0 ? new int[0] : groups(text.substring(gap + 2));
        if (head == null || tail == null) {
            return null;
        }
        int total = head.length + tail.length;
        if (gap < 0 ? total != 8 : total > 7) {
            return null;
        }
        byte[] out = new byte[16];
        for (int i = 0; i < head.length; i++) {
            out[2 * i] = (byte) (head[i] >>> 8);
            out[2 * i + 1] = (byte) head[i];
        }
        for (int i = 0; i < tail.length; i++) {
            int at = 8 - tail.length + i;
            out[2 * at] = (byte) (tail[i] >>> 8);
            out[2 * at + 1] = (byte) tail[i];
        }
        return out;
    }

    /** Colon-separated groups of 1 to 4 hex digits ("" gives none); {@code null} for anything else. */
    private static int[] groups(String text) {
        if (text.isEmpty()) {
            return new int[0];
        }
        String[] parts = text.split(":", -1);
        int[] out = new int[parts.length];
        for (int i = 0; i < parts.length; i++) {
            String part = parts[i];
            if (part.isEmpty() || part.length() > 4) {
                return null;
            }
            int value = 0;
            for (int j = 0; j < part.length(); j++) {
                int digit = Character.digit(part.charAt(j), 16);
                if (digit < 0 || part.charAt(j) > 'f') {
                    return null;
                }
                value = value * 16 + digit;
            }
            out[i] = value;
        }
        return out;
    }

    static boolean isIpv4Mapped(byte[] address) {
        for (int i = 0; i < 10; i++) {
            if (address[i] != 0) {
                return false;
            }
        }
        return address[10] == (byte) 0xFF && address[11] == (byte) 0xFF;
    }

    private static String dotted(byte[] address) {
        return (address[0] & 0xFF) + "." + (address[1] & 0xFF) + "." + (address[2] & 0xFF) + "." + (address[3] & 0xFF);
    }

    /**
     * RFC 5952 text, as Python's {@code ipaddress} writes it: lower-case groups without leading zeros, the first
     * longest run of two or more zero groups as {@code ::}.
     */
    static String compressed(byte[] address) {
        int[] groups = new int[8];
        for (int i = 0; i < 8; i++) {
            groups[i] = ((address[2 * i] & 0xFF) << 8) | (address[2 * i + 1] & 0xFF);
        }
        int bestStart = -1;
        int bestLength = 0;
        for (int i = 0; i < 8; ) {
            if (groups[i] != 0) {
                i++;
                continue;
            }
            int j = i;
            while (j < 8 && groups[j] == 0) {
                j++;
            }
            if (j - i > bestLength) {
                bestStart = i;
                bestLength = j - i;
            }
            i = j;
        }
        if (bestLength < 2) {
            bestStart = -1;
        }
        StringBuilder out = new StringBuilder(39);
        for (int i = 0; i < 8; i++) {
            if (i == bestStart) {
                out.append(i == 0 ? "::" : ":");
                i += bestLength - 1;
                continue;
            }
            out.append(Integer.toHexString(groups[i]));
            if (i < 7) {
                out.append(':');
            }
        }
        return out.toString();
    }
}
